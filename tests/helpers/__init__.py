"""Helpers shared by tests and benchmarks: subprocess servers (simulator, sshd, PostgreSQL, fake
SGLang) and free ports; study dicts and files and the `tuner` command (`studies.py`); a trial
runner on the simulator's virtual clock (`virtual.py`); the study loop on a scripted server
(`loop.py`); an in-process SGLang-speaking HTTP server for the load client (`fake_http.py`);
the checkout's paths (`paths.py`); the chaos soak's run and checks (`soak.py`); `python -m tuner`
runs forked from one interpreter that imported tuner once (`forkcli.py`). `fake_sglang.py` also runs as a script (`python
tests/helpers/fake_sglang.py`), and so does `python -m tests.helpers.fake_http`.
"""
