"""Helpers shared by tests and benchmarks: subprocess servers (simulator, sshd, PostgreSQL, fake
SGLang) and free ports. `fake_sglang.py` also runs as a script: `python tests/helpers/fake_sglang.py`.
"""
