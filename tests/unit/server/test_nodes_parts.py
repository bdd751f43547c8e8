"""A server across nodes, its pure parts: each rank's argv and flags, where each rank logs, and
whose failure a death over several ranks is (server/nodes.py), with stand-in ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.server.launch import build_launch
from tuner.server.nodes import NodesServer, rank_path, rank_spec
from tuner.server.records import ServerDeath
from tuner.sglang.failures import FailureClass, is_config_failure

SIM = ["python", "-m", "tuner.sim"]


def test_each_rank_gets_the_trials_flags_and_its_own_three() -> None:
    spec = build_launch(SIM, {"model-path": "m", "tp": 16, "api-key": "s3cret-key"}, 30000)
    ranks = [rank_spec(spec, 2, i, "gpu-a:20000") for i in range(2)]
    for i, r in enumerate(ranks):
        tail = ["--nnodes", "2", "--node-rank", str(i), "--dist-init-addr", "gpu-a:20000"]
        assert list(r.argv) == [*spec.argv, *tail]
        assert r.flags["node-rank"] == i and r.flags["nnodes"] == 2  # verified on rank 0
        assert r.secret_flags == spec.secret_flags and "s3cret-key" not in " ".join(r.argv)
        assert r.port == spec.port and r.env == spec.env


def test_rank_logs_sit_beside_rank_0s() -> None:
    assert rank_path("/w/tuner-s-trial3-ab.log", 0) == "/w/tuner-s-trial3-ab.log"
    assert rank_path("/w/tuner-s-trial3-ab.log", 1) == "/w/tuner-s-trial3-ab.rank1.log"
    assert rank_path("runs/s/trials/3/server.log", 2) == "runs/s/trials/3/server.rank2.log"
    assert rank_path("/w.d/noext", 1) == "/w.d/noext.rank1"


@dataclass
class _Logs:
    keep: bool = True
    last: str | None = None
    gone_paths: list[str] = field(default_factory=list)

    def gone(self, path: str, also=()) -> None:
        self.gone_paths.append(path)

    def sweep(self) -> None:
        pass


@dataclass
class _Rank:
    """A rank that died (or not) with `death`."""

    death: ServerDeath | None = None
    logs: _Logs = field(default_factory=_Logs)
    on_poll: object = None

    def check(self) -> ServerDeath | None:
        return self.death


OOM = ServerDeath(
    FailureClass.OOM_CUDA_GRAPH,
    "Capture cuda graph failed: CUDA out of memory",
    ("torch.OutOfMemoryError: CUDA out of memory.",),
    137,
)
KILLED = ServerDeath(FailureClass.CRASHED, "killed by SIGKILL", ("[TP1] Load weight end.",), -9)
NCCL = ServerDeath(
    FailureClass.CRASHED,
    "crashed",
    ("Process group watchdog thread terminated with exception: NCCL error: remote ...",),
    137,
)


def _server(*deaths: ServerDeath | None) -> NodesServer:
    return NodesServer([_Rank(d) for d in deaths], ["gpu-a", "gpu-b"], "gpu-a:20000")  # type: ignore[misc]


def test_a_follower_lost_to_the_world_is_the_worlds_named_by_its_node() -> None:
    death = _server(NCCL, KILLED).check()
    assert death is not None and not is_config_failure(death.failure)
    assert death.reason.startswith("node-rank 1 (gpu-b) lost without SGLang's evidence")
    assert death.evidence == KILLED.evidence and death.exit_code == -9


def test_rank_0_lost_first_is_named_when_the_follower_shows_only_nccl() -> None:
    death = _server(KILLED, NCCL).check()
    assert death is not None and death.reason.startswith("node-rank 0 (gpu-a) lost")


def test_an_oom_on_any_rank_is_the_configurations() -> None:
    death = _server(NCCL, OOM).check()
    assert death is not None and death.failure == FailureClass.OOM_CUDA_GRAPH
    assert death.reason == "node-rank 1 (gpu-b): Capture cuda graph failed: CUDA out of memory"


def test_every_rank_running_is_no_death() -> None:
    assert _server(None, None).check() is None


def test_logs_of_every_rank_are_addressed_by_rank_0s_path() -> None:
    server = _server(None, None)
    server.logs.gone("/w/t.log")
    assert [r.logs.gone_paths for r in server.servers] == [["/w/t.log"], ["/w/t.rank1.log"]]  # type: ignore[attr-defined]
