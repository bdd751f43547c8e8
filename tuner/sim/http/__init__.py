"""The simulated server in real time: SGLang's HTTP API over the engine.

`server` (start-up script, engine loop, aiohttp app, signals), `native` (`/generate`, `/health`,
`/get_server_info`, `/metrics`, ...), `openai_api` and `oaishapes` (the OpenAI endpoints in
SGLang's shapes), `routes` (every other route of the version), `common` (what the endpoints
share), `reqstate` (a request between the engine loop and its handler), `promtext` (`/metrics`).
"""
