"""Seeded request streams: what a load run sends. Pure (no network, no global random state).

Synthetic prompts are token ids (sent as `input_ids` to SGLang's native `/generate`, so the
server needs no tokenizer round-trip and lengths are exact) or, for OpenAI endpoints, one word
per token (`"w123 w77 ..."`, which the simulator counts as one token per whitespace word).

Kinds (bench_serving's datasets, sglang-reference.md section 7):
  random         lengths uniform in [max(L*ratio, 1), L] (or fixed / lognormal)
  shared-prefix  `num_groups` x `prompts_per_group`, each prompt = group prefix + own question
  multi-turn     conversations; turn k+1 = turn k's prompt + placeholder of its output + question
  sharegpt       ShareGPT JSON/JSONL (`conversations: [{from, value}, ...]`)
  jsonl          one object per line: `prompt` (required), `max_tokens` (optional)

What to build is described by the study file's `WorkloadSection` (config/schema.py), which holds every
default and check; `requests_for` is the one entry point.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tuner.config.base import MAX_TOKENS
from tuner.config.schema import StudyConfig
from tuner.config.workload import WorkloadSection
from tuner.config.yamlfile import special_file
from tuner.errors import InputFileError

# Synthetic ids stay inside every common vocabulary (Llama 128k, Qwen 151k, Mistral 32k) and
# above the special tokens, so a real SGLang accepts them as `input_ids`.
_ID_LOW, _ID_HIGH = 1000, 30000


@dataclass(frozen=True)
class Request:
    """One request to send. Exactly one of `token_ids` (synthetic) or `text` (dataset) is set.

    `conversation`/`turn` tie multi-turn requests together: turn k+1 may only be sent after
    turn k of the same conversation finished.
    """

    index: int
    prompt_len: int
    output_len: int
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    conversation: int | None = None
    turn: int = 0
    group: int | None = None

    def prompt_text(self) -> str:
        """The prompt as text: dataset text, or one word per synthetic token."""
        if self.text is not None:
            return self.text
        return " ".join([f"w{t}" for t in self.token_ids or ()])


#: requests built for a duration-bounded run when the study gives no count: at least this many,
#: and 20 per slot of the highest concurrency searched (api.study_requests builds this many)
DEFAULT_POOL = 2000


def request_pool(cfg: StudyConfig) -> int:
    """How many requests the study's list starts with (the study file's count, else 20 per slot
    of the highest concurrency; a window's run of a random or multi-turn kind tops it up)."""
    top = cfg.space.get("concurrency")
    high = cfg.workload.concurrency or 1
    if top is not None and top.high is not None:
        high = int(top.high)
    elif top is not None and top.choices:
        high = max(int(c) for c in top.choices if isinstance(c, int | float))
    return cfg.workload.num_requests or max(DEFAULT_POOL, 20 * high)


def requests_for(w: WorkloadSection, *, num_requests: int) -> list[Request]:
    """The request list `w` describes; the same section (seed included) gives the same list.

    `num_requests` is how many to build when `w.num_requests` is None (a duration-bounded run:
    enough to start the window; `more_requests` extends a random or multi-turn list).
    shared-prefix builds at most `num_groups * prompts_per_group` requests (the study check
    refuses a count above that); multi-turn builds ceil(count / turns) conversations of `turns`
    turns; datasets give at most the count.
    """
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1 (got {num_requests})")
    n = w.num_requests or num_requests
    rng = random.Random(w.seed)
    if w.kind == "random":
        return _random(w, n, rng)
    if w.kind == "shared-prefix":
        # every prompt is sent once: the count takes the first ones (after the shuffle)
        return _shared_prefix(w, rng)[: w.num_requests or None]
    if w.kind == "multi-turn":
        return _multi_turn(w, n, rng)
    if w.kind == "sharegpt":
        return _sharegpt(w, n, rng)
    return _jsonl(w, n, rng)


#: kinds whose requests are drawn at random: a duration-bound run that used its list up gets
#: more of the same (`more_requests`); the others' lists are finite by definition (shared-prefix
#: groups, dataset records), and repeating their prompts would measure the prefix cache
EXTENDABLE = ("random", "multi-turn")


def more_requests(w: WorkloadSection, start: int, n: int) -> list[Request]:
    """At least `n` more requests of `w`'s kind for a run that used up its list, numbered from
    `start` (conversations too: `start` exceeds every earlier one's number); seeded by `w.seed`
    and `start`, so a run that needs them again gets the same ones. [] for a finite kind."""
    if w.kind not in EXTENDABLE or n < 1:
        return []
    rng = random.Random(f"{w.seed}:more:{start}")
    batch = _random(w, n, rng) if w.kind == "random" else _multi_turn(w, n, rng)
    return [
        replace(
            r,
            index=start + r.index,
            conversation=None if r.conversation is None else start + r.conversation,
        )
        for r in batch
    ]


#: a warm-up request's answer is cut to this many tokens, as bench_serving's is (`output_len=
#: min(output_len, 32)`: sglang/benchmark/serving.py:1481 in 0.5.23, bench_serving.py:1995 in
#: 0.5.6.post2). The full prompt still runs its prefill; a long answer warms nothing more and
#: cost 14 s a load run on a 1,024-token workload.
WARMUP_MAX_TOKENS = 32


def warmup_requests(requests: Sequence[Request], n: int) -> list[Request]:
    """The `n` untimed requests a load run warms the server with: the list's first (cycled),
    answers capped at WARMUP_MAX_TOKENS."""
    if not requests:
        return []
    return [
        replace(r, output_len=min(r.output_len, WARMUP_MAX_TOKENS))
        for r in (requests[i % len(requests)] for i in range(n))
    ]


def list_size(w: WorkloadSection, num_requests: int) -> int:
    """How many requests `requests_for(w, num_requests=...)` builds for a synthetic kind (a
    dataset's count is its records', at most the count)."""
    n = w.num_requests or num_requests
    if w.kind == "shared-prefix":
        return min(n, w.num_groups * w.prompts_per_group)
    if w.kind == "multi-turn":
        return math.ceil(n / w.turns) * w.turns
    return n


def sample_length(rng: random.Random, length: int, w: WorkloadSection) -> int:
    """One length around `length` per `w`'s distribution (bench_serving's random rule)."""
    if w.length_dist == "fixed":
        return length
    if w.length_dist == "lognormal":
        # median `length`; clipped so one outlier cannot blow the context window
        value = length * math.exp(rng.gauss(0.0, w.lognormal_sigma))
        return max(1, min(4 * length, round(value)))
    low = max(int(length * w.range_ratio), 1)
    return rng.randint(low, length)


def _ids(rng: random.Random, n: int) -> tuple[int, ...]:
    # 4 random bytes per id in one call: a study's list holds millions of ids, and one
    # randrange per id took seconds of every `tuner tune` start (the modulo bias is ~1e-5)
    span = _ID_HIGH - _ID_LOW
    return tuple(_ID_LOW + x % span for x in struct.unpack(f"<{n}I", rng.randbytes(4 * n)))


def _random(w: WorkloadSection, n: int, rng: random.Random) -> list[Request]:
    out = []
    for i in range(n):
        n_in = sample_length(rng, w.input_len, w)
        n_out = sample_length(rng, w.output_len, w)
        out.append(Request(i, n_in, n_out, token_ids=_ids(rng, n_in)))
    return out


def _shared_prefix(w: WorkloadSection, rng: random.Random) -> list[Request]:
    pairs: list[tuple[int, tuple[int, ...]]] = []
    for g in range(w.num_groups):
        prefix = _ids(rng, w.prefix_len)
        for _ in range(w.prompts_per_group):
            pairs.append((g, prefix + _ids(rng, w.question_len)))
    if w.shuffle:
        # interleaved groups are the case where a small pool evicts prefixes (HiCache matters)
        rng.shuffle(pairs)
    return [
        Request(i, len(ids), w.output_len, token_ids=ids, group=g)
        for i, (g, ids) in enumerate(pairs)
    ]


def _multi_turn(w: WorkloadSection, n: int, rng: random.Random) -> list[Request]:
    n_conv = math.ceil(n / w.turns)
    per_conv: list[list[Request]] = []
    idx = 0
    for c in range(n_conv):
        history = _ids(rng, sample_length(rng, w.input_len, w))
        turns = []
        for t in range(w.turns):
            if t > 0:
                prev = turns[-1]
                # the real output is unknown when the list is built: a placeholder of its length
                history = history + _ids(rng, prev.output_len) + _ids(rng, w.question_len)
            n_out = sample_length(rng, w.output_len, w)
            turns.append(
                Request(idx, len(history), n_out, token_ids=history, conversation=c, turn=t)
            )
            idx += 1
        per_conv.append(turns)
    # round-robin order: conversation c's turn t comes after every conversation's turn t-1,
    # so a plain in-order sender never waits on its own previous turn
    ordered = [conv[t] for t in range(w.turns) for conv in per_conv]
    return [
        Request(
            i,
            r.prompt_len,
            r.output_len,
            token_ids=r.token_ids,
            conversation=r.conversation,
            turn=r.turn,
        )
        for i, r in enumerate(ordered)
    ]


#: ShareGPT's V3 file is 0.7 GB; a dataset is read whole before the first request
MAX_DATASET_BYTES = 2 << 30


def _words(text: str) -> int:
    return len(text.split())


def _read_records(path: str) -> list[tuple[int | None, Any]]:
    """(line, object) pairs from a JSONL file, or (None, object) from a JSON array file."""
    p = Path(path)
    if problem := special_file(p):  # a FIFO blocks forever, /dev/zero never ends
        raise InputFileError(path, problem)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    if size > MAX_DATASET_BYTES:
        # read whole, its records as Python objects take ~5x the file: the machine would swap
        raise InputFileError(
            path, f"{size / 2**30:.1f} GiB: at most {MAX_DATASET_BYTES >> 30} GiB; take a sample"
        )
    try:
        raw = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputFileError(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputFileError(path, "not UTF-8 text") from None
    if raw.lstrip().startswith("["):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputFileError(path, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
        except RecursionError:  # json nests by recursion: [[[[...]]]] a million deep
            raise InputFileError(path, "invalid JSON: nested too deeply") from None
        except ValueError:  # Python refuses to parse an integer of more than 4300 digits
            raise InputFileError(path, "invalid JSON: an integer too long") from None
        if not isinstance(data, list) or not data:
            raise InputFileError(path, "expected a non-empty JSON array of records")
        return [(None, obj) for obj in data]
    out = []
    for n, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise InputFileError(path, f"invalid JSON: {exc.msg}", line=n) from None
        except RecursionError:
            raise InputFileError(path, "invalid JSON: nested too deeply", line=n) from None
        except ValueError:  # an integer of more than 4300 digits
            raise InputFileError(path, "invalid JSON: an integer too long", line=n) from None
    if not out:
        raise InputFileError(path, "no records")
    return out


def _bad(path: str, line: int | None, recno: int, message: str) -> InputFileError:
    """Name the line of a JSONL file, or the record number in a JSON array."""
    if line is None:
        return InputFileError(path, f"record {recno}: {message}")
    return InputFileError(path, message, line=line)


def _finish(
    w: WorkloadSection, n: int, rng: random.Random, items: list[tuple[str, int]]
) -> list[Request]:
    if w.shuffle:
        rng.shuffle(items)
    items = items[:n]
    return [Request(i, _words(t), n_out, text=t) for i, (t, n_out) in enumerate(items)]


def _sharegpt(w: WorkloadSection, n: int, rng: random.Random) -> list[Request]:
    path = str(w.dataset)
    items: list[tuple[str, int]] = []
    for recno, (line, rec) in enumerate(_read_records(path), start=1):
        conv = rec.get("conversations") if isinstance(rec, dict) else None
        if conv is None and isinstance(rec, dict):
            conv = rec.get("conversation")
        if not isinstance(conv, list):
            raise _bad(path, line, recno, "record has no 'conversations' list")
        turns = []
        for turn in conv:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise _bad(path, line, recno, "a turn lacks a string 'value'")
            if "from" not in turn:
                raise _bad(path, line, recno, "a turn lacks 'from'")
            turns.append(turn["value"])
        # as bench_serving: first turn is the prompt, second the reference completion
        if len(turns) < 2 or not turns[0].strip():
            continue
        n_out = w.dataset_output_len or _words(turns[1])
        if n_out < 1:
            continue
        items.append((turns[0], n_out))
    if not items:
        raise InputFileError(path, "no conversation with a prompt and a reply")
    return _finish(w, n, rng, items)


def _jsonl(w: WorkloadSection, n: int, rng: random.Random) -> list[Request]:
    path = str(w.dataset)
    items: list[tuple[str, int]] = []
    for recno, (line, rec) in enumerate(_read_records(path), start=1):
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
            raise _bad(path, line, recno, "record lacks a string 'prompt'")
        if not rec["prompt"].strip():
            raise _bad(path, line, recno, "'prompt' is empty")
        n_out = rec.get("max_tokens", w.dataset_output_len or w.output_len)
        if isinstance(n_out, bool) or not isinstance(n_out, int) or not 1 <= n_out <= MAX_TOKENS:
            shown = n_out if not isinstance(n_out, int) or n_out < 10**12 else "a huge number"
            raise _bad(
                path,
                line,
                recno,
                f"'max_tokens' must be an integer in 1..{MAX_TOKENS:,} (got {shown!r})",
            )
        items.append((rec["prompt"], w.dataset_output_len or n_out))
    return _finish(w, n, rng, items)


def mean_length(length: int, w: WorkloadSection) -> float:
    """The mean of the lengths `loadgen.workload.sample_length` draws around `length`."""
    if w.length_dist == "fixed":
        return float(length)
    if w.length_dist == "lognormal":  # median `length`, clipped to [1, 4 L]
        return min(length * math.exp(w.lognormal_sigma**2 / 2), 4.0 * length)
    return (max(int(length * w.range_ratio), 1) + length) / 2


def request_tokens(
    w: WorkloadSection, requests: Sequence[Request] | None = None, answer: float = 0.5
) -> tuple[float, float]:
    """(tokens a running request holds on average, the share of them a shared prefix holds
    once): prompt plus half the answer, which is what fills the pool in steady state (`answer`:
    the share of the answer counted; 1.0 for a request at its full length). The lengths are the
    ones tuner.loadgen.workload builds; a dataset's are its list's (`requests`)."""
    if w.kind in ("sharegpt", "jsonl") and requests:
        prompt = sum(r.prompt_len for r in requests) / len(requests)
        return prompt + answer * sum(r.output_len for r in requests) / len(requests), 0.0
    if w.kind == "shared-prefix":  # fixed lengths: every prompt is prefix + question
        held = w.prefix_len + w.question_len + answer * w.output_len
        return held, w.prefix_len / held
    if w.kind in ("sharegpt", "jsonl"):  # no list: input_len is the user's estimate
        return w.input_len + answer * (w.dataset_output_len or w.output_len), 0.0
    out = mean_length(w.output_len, w)
    prompt = mean_length(w.input_len, w)
    if w.kind == "multi-turn":
        # the history grows by a question and an answer per turn: the mean over the turns
        prompt += (w.turns - 1) / 2 * (w.question_len + out)
    return prompt + answer * out, 0.0
