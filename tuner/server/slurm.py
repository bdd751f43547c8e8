"""The server as a Slurm step: every salloc/srun/squeue/scancel/sinfo command line the tuner runs
for the study file's `target.slurm` (its schema: `config/slurm.py`), and what their output
means. Pure (no I/O); `server.allocation` and `server.steps` run them on the login node.

The study holds one allocation, `salloc --no-shell --job-name=PREFIX-TAG ...` (TAG: 12 hex of
the worker's marker, so a resumed run finds it again by name), and runs each server as one step
in it: `srun --jobid=J --job-name=PREFIX-TAG-server --nodes=1 --ntasks=1 --gres=gpu:N ARGV`, attached, from
the launch script: srun's output is the server log, its exit status the task's, and signals
to srun reach the task. A step outlives a killed srun, so it is cancelled by its id
(`scancel J.S`, found by its name in `squeue --steps`) once srun is gone; a killed run's steps
are found the same way. No `--overlap`: a step that could not be stopped makes the next one
wait (a start timeout, the world's) instead of sharing its GPUs (an OOM taken for the flags').

Whose failure: a step that ended because Slurm ended it (slurmstepd's "CANCELLED ... DUE TO
NODE FAILURE / PREEMPTION / TIME LIMIT", srun's "Node failure on ...", or a job no longer
RUNNING) is the world's (`world_end`); salloc's refusal of the request (an unknown partition
or account, a GRES the partition lacks) is the user's (`salloc_refusal`), as is srun's refusal
of the step's options (`step_refusal`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tuner.config.slurm import SlurmSection
from tuner.server.launch import LaunchSpec

#: the commands a Slurm target needs on the login node's PATH (with target.env)
COMMANDS = ("salloc", "srun", "squeue", "scancel")
#: job states of an allocation that can run steps, and of one that may still come to
USABLE = frozenset({"RUNNING"})
WAITING = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
)
#: the output fields the tuner asks squeue for, `|`-separated (a name never holds one)
JOB_FORMAT = "%i|%T|%r|%N"
STEP_FORMAT = "%i|%j"
#: a node name the tuner connects to (never a shell word or a URL part)
_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: slurmstepd's banner when Slurm itself ended a step or job (not "DUE TO TASK FAILURE": the
#: server's own), and srun's word for a lost node
_ENDED_BY_SLURM = re.compile(
    r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ DUE TO "
    r"(?:NODE FAIL|PREEMPTION|TIME LIMIT|JOB REQUEUE|DEADLINE)|"
    r"srun: error: Node failure on \S+|"
    r"\*\*\* (?:STEP|JOB) \S+ ON \S+ (?:PREEMPTED|NODE_FAIL)\b",
    re.I,
)
#: salloc errors that are the world's (the controller unreachable or busy), not the request's
_SALLOC_WORLD = re.compile(
    r"unable to contact slurm controller|socket timed out|zero bytes were transmitted|"
    r"communication connection failure|temporarily unavailable|slurmctld",
    re.I,
)
#: srun's refusal of the step itself (its options, a GRES), not a task's exit
_STEP_REFUSED = re.compile(
    r"^srun: (?:error: )?(?:unrecognized option|invalid option|option .* requires|"
    r"Unable to create step for job \d+: |error: Invalid )",
    re.I,
)
#: refusals that are the allocation's state (gone, busy), the world's
_STEP_WORLD = re.compile(
    r"already completing or completed|invalid job id|requested nodes are busy|socket timed out|"
    r"unable to contact|job has been cancelled|job/step does not exist",
    re.I,
)


@dataclass(frozen=True)
class Job:
    """One row of squeue about a job: its id, state (%T), reason (%r) and node list (%N)."""

    id: str
    state: str
    reason: str = ""
    nodes: str = ""

    @property
    def node(self) -> str | None:
        """The allocation's first node (where the step runs), or None before it has one."""
        return first_node(self.nodes)

    def describe(self) -> str:
        """`job 123 PENDING (Resources)`."""
        why = f" ({self.reason})" if self.reason and self.reason != "None" else ""
        return f"job {self.id} {self.state}{why}"


@dataclass(frozen=True)
class Step:
    """One row of `squeue --steps`: `JOB.STEP` and the step's name."""

    id: str
    name: str


def tag(marker: str | None) -> str:
    """12 hex of the worker's marker (stable across runs), random without one."""
    return hashlib.sha256(marker.encode()).hexdigest()[:12] if marker else secrets.token_hex(6)


def job_name(prefix: str, marker: str | None) -> str:
    """The allocation's job name, `PREFIX-TAG`."""
    return f"{prefix}-{tag(marker)}"


def step_name(job: str) -> str:
    """Every server step's name: the job's, `-server` added."""
    return f"{job}-server"


def salloc_argv(section: SlurmSection, name: str) -> list[str]:
    """`salloc --no-shell ...`: the allocation of one node with `gpus` GPUs for `time`."""
    argv = ["salloc", "--no-shell", f"--job-name={name}", f"--partition={section.partition}"]
    if section.account:
        argv.append(f"--account={section.account}")
    argv += ["--nodes=1", f"--gres=gpu:{section.gpus}", f"--time={section.time}"]
    return [*argv, *section.options]


def srun_argv(section: SlurmSection, job_id: str, step: str, inner: Sequence[str]) -> list[str]:
    """`srun ... ARGV`: one task on the allocation's node, named `step`, with the allocation's
    GPUs there (asked explicitly) and its CPUs and memory (Slurm's default without --exact)."""
    argv = ["srun", f"--jobid={job_id}", f"--job-name={step}", "--nodes=1", "--ntasks=1"]
    return [*argv, f"--gres=gpu:{section.gpus}", *section.srun_options, *inner]


def wrap(spec: LaunchSpec, section: SlurmSection, job_id: str, step: str) -> LaunchSpec:
    """`spec` run as a step: the same spec (env, port, flags) with srun's argv. The launch
    script exports the environment and execs srun, which passes it on (--export=ALL)."""
    return replace(spec, argv=tuple(srun_argv(section, job_id, step, spec.argv)))


def jobs_argv(name: str) -> list[str]:
    """This user's live jobs named `name`, one `ID|STATE|REASON|NODES` row each."""
    return ["squeue", "--me", "--noheader", f"--name={name}", f"--format={JOB_FORMAT}"]


def job_argv(job_id: str) -> list[str]:
    """The job `job_id` in any state (an ended one while slurmctld still keeps it)."""
    argv = ["squeue", "--me", "--noheader", f"--jobs={job_id}", "--states=all"]
    return [*argv, f"--format={JOB_FORMAT}"]


def steps_argv() -> list[str]:
    """This user's running steps, one `JOB.STEP|NAME` row each."""
    return ["squeue", "--me", "--noheader", "--steps", f"--format={STEP_FORMAT}"]


def scancel_argv(job_or_step: str) -> list[str]:
    """Cancel one job (`123`) or one step (`123.4`): never anything by name."""
    if not re.fullmatch(r"\d+(\.\d+)?", job_or_step):
        raise ValueError(f"not a Slurm job or step id: {job_or_step!r}")
    return ["scancel", job_or_step]


def sinfo_argv(partition: str) -> list[str]:
    """The partition's node groups: `NAME|AVAIL|NODES|GRES` (nothing for an unknown one)."""
    return ["sinfo", "--noheader", f"--partition={partition}", "--format=%P|%a|%D|%G"]


def parse_jobs(text: str) -> list[Job]:
    """squeue's `ID|STATE|REASON|NODES` rows (anything else dropped)."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 4 and parts[0].isdigit() and parts[1]:
            out.append(Job(parts[0], parts[1].upper(), parts[2], parts[3]))
    return out


def parse_steps(text: str) -> list[Step]:
    """squeue --steps' `JOB.STEP|NAME` rows (numeric steps only: not `extern` or `batch`)."""
    out = []
    for line in text.splitlines():
        sid, _, name = (p.strip() for p in line.partition("|"))
        if re.fullmatch(r"\d+\.\d+", sid):
            out.append(Step(sid, name))
    return out


def pick(jobs: Sequence[Job], known: str | None = None) -> Job | None:
    """The allocation to use among the live jobs of our name: the one we hold, else a running
    one, else the oldest still waiting; None when none is live."""
    live = [j for j in jobs if j.state in USABLE | WAITING]
    for job in live:
        if job.id == known:
            return job
    live.sort(key=lambda j: (j.state not in USABLE, int(j.id)))
    return live[0] if live else None


def first_node(nodelist: str) -> str | None:
    """The first host of a Slurm node list (`gpu[01-04,07]` -> `gpu01`), None when empty or
    not a plain host name."""
    text, depth = nodelist.strip(), 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            text = text[:i]
            break
    node = re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], text)
    return node if _NODE_RE.match(node) and node not in ("None", "(null)") else None


def world_end(tail: Sequence[str], job: Job | None, job_id: str | None) -> str | None:
    """Why Slurm, not the server, ended the step: slurmstepd's or srun's line in the log tail,
    or the allocation no longer RUNNING (`job`: squeue's row, None when gone); else None."""
    hit = next((ln.strip() for ln in reversed(tail) if _ENDED_BY_SLURM.search(ln)), None)
    if hit is not None:
        return hit
    if job_id is None:
        return None
    if job is None:
        return f"job {job_id} is gone (squeue no longer lists it)"
    if job.state not in USABLE:
        return job.describe()
    return None


_GRANTED = re.compile(r"salloc: Granted job allocation (\d+)")


def salloc_granted(lines: Sequence[str]) -> str | None:
    """The job salloc's log says it was granted, or None: salloc exits once granted, and squeue
    may list the job a moment later (the controller answers it from its own state)."""
    for line in reversed(lines):
        if m := _GRANTED.search(line):
            return m.group(1)
    return None


def salloc_refusal(lines: Sequence[str]) -> tuple[bool, str]:
    """(is it the user's request, salloc's line) for an salloc that ended without a job."""
    said = [ln.strip() for ln in lines if ln.strip()]
    errors = [ln for ln in said if "error" in ln.lower()]
    line = errors[-1] if errors else (said[-1] if said else "salloc ended without a word")
    return not _SALLOC_WORLD.search(line), line


def step_refusal(tail: Sequence[str]) -> str | None:
    """srun's refusal of the step's own options (the user's target.slurm), or None."""
    for line in reversed(tail):
        text = line.strip()
        if _STEP_REFUSED.search(text) and not _STEP_WORLD.search(text):
            return text
    return None


def gres_gpus(gres: str) -> int | None:
    """The GPUs per node sinfo's %G names (`gpu:8`, `gpu:h100:8(S:0-1)`), None without."""
    counts = [int(n) for n in re.findall(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", gres)]
    return max(counts) if counts else None


def shell(argv: Sequence[str]) -> str:
    """One command line, every value quoted."""
    return " ".join(shlex.quote(str(a)) for a in argv)
