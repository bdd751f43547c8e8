"""Slurm's command lines, what their output means, and the `target.slurm` section (pure:
tuner/server/slurm.py, tuner/config/slurm.py).

The argv builders are checked for shape (the job and step names from the marker, the owned
options, the user's after them, the server's argv last) and for quoting through a shell; the
parsers against squeue's and sinfo's rows; the classifiers against the lines Slurm prints when
it ends a step itself (the world's), and salloc's and srun's refusals (the user's).
"""

from __future__ import annotations

import shlex

import pytest

from tests.helpers.studies import study_dict
from tuner.config.load import parse_study
from tuner.config.slurm import SlurmSection, slurm_time
from tuner.errors import ConfigError
from tuner.server.launch import build_launch
from tuner.server.slurm import (
    Job,
    first_node,
    gres_gpus,
    job_argv,
    job_name,
    jobs_argv,
    parse_jobs,
    parse_steps,
    pick,
    salloc_argv,
    salloc_granted,
    salloc_refusal,
    scancel_argv,
    shell,
    sinfo_argv,
    srun_argv,
    step_name,
    step_refusal,
    steps_argv,
    world_end,
    wrap,
)

S = SlurmSection(
    partition="gpu",
    account="proj-1",
    gpus=8,
    time="12:00:00",
    options=["--qos=high", "--cpus-per-gpu=16"],
    srun_options=["--container-image=lmsysorg/sglang:latest"],
)


def test_names_are_stable_per_marker_and_differ_between_markers() -> None:
    a = job_name("tuner", "tuner-abc")
    assert a == job_name("tuner", "tuner-abc") and a.startswith("tuner-") and len(a) == 18
    assert a != job_name("tuner", "tuner-abd")
    assert job_name("tuner", None) != job_name("tuner", None)  # random without a marker
    assert step_name(a) == a + "-server"


def test_salloc_holds_one_node_without_a_shell() -> None:
    assert salloc_argv(S, "tuner-x") == [
        "salloc", "--no-shell", "--job-name=tuner-x", "--partition=gpu", "--account=proj-1",
        "--nodes=1", "--gres=gpu:8", "--time=12:00:00", "--qos=high", "--cpus-per-gpu=16",
    ]  # fmt: skip
    bare = SlurmSection(partition="gpu", gpus=1, time="30")
    assert "--account" not in " ".join(salloc_argv(bare, "n"))


def test_srun_runs_one_named_task_of_the_allocation_with_the_servers_argv_last() -> None:
    inner = ["python3", "-m", "sglang.launch_server", "--port", "30000"]
    argv = srun_argv(S, "4242", "tuner-x-server", inner)
    assert argv[:5] == [
        "srun", "--jobid=4242", "--job-name=tuner-x-server", "--nodes=1", "--ntasks=1",
    ]  # fmt: skip
    assert "--overlap" not in argv  # a stray step makes the next one wait, never share GPUs
    assert argv[5:7] == ["--gres=gpu:8", "--container-image=lmsysorg/sglang:latest"]
    assert argv[7:] == inner


def test_wrap_keeps_the_spec_and_its_secrets_out_of_argv() -> None:
    flags = {"model-path": "/m", "api-key": "sk-secret-1234", "host": "0.0.0.0"}
    spec = build_launch(["python3", "-m", "sglang.launch_server"], flags, 30000, env={"A": "b c"})
    wrapped = wrap(spec, S, "7", "tuner-x-server")
    assert wrapped.argv[0] == "srun" and wrapped.argv[-len(spec.argv) :] == spec.argv
    assert (wrapped.env, wrapped.port, wrapped.flags) == (spec.env, spec.port, spec.flags)
    script = wrapped.script("/w/s.log.secrets.yaml")
    assert "sk-secret-1234" not in script  # the secret flags reach SGLang in the --config file
    last = script.strip().splitlines()[-1]
    assert shlex.split(last)[:2] == ["exec", "srun"]
    assert shlex.split(last)[-2:] == ["--config", "/w/s.log.secrets.yaml"]
    assert "export A='b c'" in script  # srun passes the environment on (--export=ALL)


def test_squeue_scancel_and_sinfo_lines() -> None:
    assert jobs_argv("tuner-x") == [
        "squeue", "--me", "--noheader", "--name=tuner-x", "--format=%i|%T|%r|%N",
    ]  # fmt: skip
    assert job_argv("12")[-2:] == ["--states=all", "--format=%i|%T|%r|%N"]
    assert steps_argv() == ["squeue", "--me", "--noheader", "--steps", "--format=%i|%j"]
    assert scancel_argv("12") == ["scancel", "12"] and scancel_argv("12.3") == ["scancel", "12.3"]
    for bad in ("tuner-x", "12; rm -rf /", "", "-u me"):
        with pytest.raises(ValueError):
            scancel_argv(bad)  # by id only: never by name, never a shell word
    assert sinfo_argv("gpu")[-1] == "--format=%P|%a|%D|%G"


def test_every_value_is_quoted_for_the_shell() -> None:
    odd = SlurmSection(partition="gpu", gpus=1, time="1h", options=["--comment=a b;$(x)"])
    line = shell(salloc_argv(odd, "n"))
    assert shlex.split(line)[-1] == "--comment=a b;$(x)"


def test_squeue_rows_are_parsed_and_the_allocation_picked() -> None:
    text = (
        "101|PENDING|Priority|\n"
        "99|RUNNING|None|gpu[01-02]\n"
        "98|CANCELLED|None|gpu03\n"
        "garbage line\n"
        "100|PENDING|Resources|\n"
    )
    jobs = parse_jobs(text)
    assert [j.id for j in jobs] == ["101", "99", "98", "100"]
    assert jobs[1] == Job("99", "RUNNING", "None", "gpu[01-02]") and jobs[1].node == "gpu01"
    assert pick(jobs).id == "99"  # a running one first
    assert pick(jobs, known="101").id == "101"  # the one we hold
    assert pick([j for j in jobs if j.state != "RUNNING"]).id == "100"  # else the oldest waiting
    assert pick([jobs[2]]) is None  # an ended job is no allocation
    assert jobs[0].describe() == "job 101 PENDING (Priority)"
    assert jobs[1].describe() == "job 99 RUNNING"
    steps = parse_steps("99.0|tuner-x-server\n99.extern|extern\n99.1|other\nnoise\n")
    assert [(s.id, s.name) for s in steps] == [("99.0", "tuner-x-server"), ("99.1", "other")]


@pytest.mark.parametrize(
    ("nodelist", "node"),
    [
        ("gpu01", "gpu01"),
        ("127.0.0.1", "127.0.0.1"),
        ("gpu[01-04,07]", "gpu01"),
        ("gpu[07,01-04]", "gpu07"),
        ("rack[2-3]-n[10-11],other", "rack2-n10"),
        ("a1,b2", "a1"),
        ("", None),
        ("(null)", None),
        ("x;reboot", None),
    ],
)
def test_first_node_of_a_node_list(nodelist: str, node: str | None) -> None:
    assert first_node(nodelist) == node


def test_a_step_slurm_ended_is_the_worlds() -> None:
    running = Job("9", "RUNNING", "None", "n1")
    plain = ["Traceback ...", "torch.OutOfMemoryError: CUDA out of memory"]
    assert world_end(plain, running, "9") is None  # the server's own death: SGLang's evidence
    for line in (
        "slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01T03:00:00 DUE TO "
        "NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***",
        "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-01-01T03:00:00 DUE TO PREEMPTION ***",
        "slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01T03:00:00 DUE TO TIME LIMIT ***",
        "srun: error: Node failure on n1",
    ):
        assert world_end([*plain, line], running, "9") == line
    # our own scancel of the step is no reason of Slurm's
    ours = "slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01T03:00:00 ***"
    assert world_end([ours], running, "9") is None
    task = "slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-01-01T03:00:00 DUE TO TASK FAILURE ***"
    assert world_end([task], running, "9") is None  # --kill-on-bad-exit: the server's own end
    assert world_end(plain, Job("9", "NODE_FAIL", "NodeFail"), "9") == "job 9 NODE_FAIL (NodeFail)"
    assert world_end(plain, Job("9", "PREEMPTED"), "9") == "job 9 PREEMPTED"
    assert world_end(plain, Job("9", "PENDING", "BeginTime"), "9") == "job 9 PENDING (BeginTime)"
    assert "is gone" in (world_end(plain, None, "9") or "")
    assert world_end(plain, None, None) is None  # no allocation known: the tail alone


def test_salloc_and_srun_refusals() -> None:
    users, line = salloc_refusal(
        [
            "salloc: error: invalid partition specified: gpux",
            "salloc: error: Job submit/allocate failed: Invalid partition name specified",
        ]
    )
    assert users and line.endswith("Invalid partition name specified")
    users, line = salloc_refusal(
        ["salloc: error: Unable to contact slurm controller (connect failure)"]
    )
    assert not users  # the controller down is the world's
    assert salloc_refusal([]) == (True, "salloc ended without a word")
    # salloc exits once granted: its log, not squeue (which may lag), says so
    granted = ["salloc: Pending job allocation 4000", "salloc: Granted job allocation 4000"]
    assert salloc_granted(granted) == "4000"
    assert salloc_granted(granted[:1]) is None and salloc_granted([]) is None
    assert step_refusal(["srun: unrecognized option '--bogus'", "Try srun --help"]) is not None
    gres = "srun: error: Unable to create step for job 9: Invalid generic resource (gres) specification"
    assert step_refusal(["x", gres]) == gres
    for world in (
        "srun: error: Unable to create step for job 9: Invalid job id specified",
        "srun: error: Unable to create step for job 9: Job/step already completing or completed",
    ):
        assert step_refusal([world]) is None
    assert step_refusal(["srun: error: n1: task 0: Exited with exit code 1"]) is None


def test_gres_gpus() -> None:
    assert gres_gpus("gpu:8") == 8
    assert gres_gpus("gpu:h100:8(S:0-1)") == 8
    assert gres_gpus("gpu:a100:4,gpu:h100:8") == 8
    assert gres_gpus("(null)") is None


# --- the study file's section --------------------------------------------------------------


def slurm_study(slurm: dict | None = None, **target: object) -> dict:
    section = {"partition": "gpu", "gpus": 8, "time": "12:00:00", **(slurm or {})}
    return study_dict(
        target={"host": "local", "workdir": "/shared/w", "slurm": section, **target},
        server={"model-path": "m", "host": "0.0.0.0"},
    )


def test_a_good_section_parses() -> None:
    cfg = parse_study(slurm_study({"account": "p", "options": ["--qos=high"]}))
    s = cfg.target.slurm
    assert s is not None and (s.partition, s.account, s.gpus, s.time) == ("gpu", "p", 8, "12:00:00")
    assert s.job_name_prefix == "tuner" and s.pending_s == 3600


@pytest.mark.parametrize(
    ("text", "slurm"),
    [
        ("12:00:00", "12:00:00"),
        ("1-00:00:00", "1-00:00:00"),
        ("90", "90"),
        ("12h", "0-12:00:00"),
        ("90s", "0-00:02:00"),
        ("36h", "1-12:00:00"),
    ],
)
def test_walltimes(text: str, slurm: str) -> None:
    assert slurm_time(text) == slurm


@pytest.mark.parametrize(
    ("slurm", "key", "fragment"),
    [
        ({"time": 43200}, "target.slurm.time", "YAML reads an unquoted 12:00:00 as a number"),
        ({"time": "soon"}, "target.slurm.time", "expected a walltime such as '12:00:00'"),
        ({"time": "0:00"}, "target.slurm.time", "expected a walltime"),
        ({"partition": "gpu; rm"}, "target.slurm.partition", "is not a partition name"),
        ({"account": "a b"}, "target.slurm.account", "is not an account name"),
        ({"gpus": 0}, "target.slurm.gpus", "greater than or equal to 1"),
        ({"gpus": "8"}, "target.slurm.gpus", "valid integer"),
        ({"job_name_prefix": "-x"}, "target.slurm.job_name_prefix", "starting with a letter"),
        ({"options": ["--job-name=x"]}, "target.slurm.options", "the tuner names its allocation"),
        ({"options": ["-p", "other"]}, "target.slurm.options", "use target.slurm.partition"),
        ({"options": ["--gres=gpu:4"]}, "target.slurm.options", "use target.slurm.gpus"),
        ({"options": ["qos"]}, "target.slurm.options", "expected salloc options"),
        ({"srun_options": ["--overlap"]}, "target.slurm.srun_options", "share the GPUs"),
        ({"srun_options": ["--jobid=3"]}, "target.slurm.srun_options", "its own allocation"),
        ({"pending_s": -1}, "target.slurm.pending_s", "greater than 0"),
        ({"bogus": 1}, "target.slurm.bogus", "unknown key"),
    ],
)
def test_bad_sections_name_the_key(slurm: dict, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_study(slurm_study(slurm))
    assert err.value.key == key, str(err.value)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_missing_key_is_named() -> None:
    data = slurm_study()
    del data["target"]["slurm"]["time"]
    with pytest.raises(ConfigError, match=r"target\.slurm\.time: required key is missing"):
        parse_study(data)


@pytest.mark.parametrize(
    ("target", "server", "key", "fragment"),
    [
        ({"container": {"image": "x"}}, None, "target.slurm", "cannot be combined"),
        ({"gpus": "0,1"}, None, "target.gpus", "the allocation's GPUs"),
        ({"http_host": "n1"}, None, "target.http_host", "through target.host"),
        ({"workdir": None}, None, "target.workdir", "a directory the compute nodes share"),
        ({}, {"model-path": "m"}, "server.host", "set the address it listens on"),
    ],
)
def test_what_slurm_cannot_run_with(
    target: dict, server: dict | None, key: str, fragment: str
) -> None:
    data = slurm_study(**target)
    data["target"] = {k: v for k, v in data["target"].items() if v is not None}
    if server is not None:
        data["server"] = server
    with pytest.raises(ConfigError) as err:
        parse_study(data)
    assert err.value.key == key and fragment in str(err.value), str(err.value)
