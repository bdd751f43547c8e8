"""The simulated SGLang server: SGLang's flags, HTTP API, capacity math and failures, no GPU."""
