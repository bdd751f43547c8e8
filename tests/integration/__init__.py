"""Integration tests: real processes, HTTP, sshd, PostgreSQL; a folder per package of tuner/."""
