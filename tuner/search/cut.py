"""Early-stopped load runs: end a run once it clearly cannot beat the best point known. Pure.

A load run scores a window of W seconds: every output token received in it, over W. Watched
about once a second (loadgen's `LoadProgress`: tokens received so far, requests ended and
streaming), the score the run will end with is projected from the rate since its batch filled:

    rate = (tokens(t) - tokens(full)) / (t - full)     projected = (tokens(t) + rate * (W - t)) / W

"Filled": every stream has had a token, or (a pool that admits fewer than the streams) as many
requests ended as ever streamed at once. Not the rate since t = 0, which counts the first
prefill; not a recent rate: a closed loop of equal requests runs in waves, and a recent rate
swings with where the last wave fell (Kimi TP8, 16 streams of 1,000 tokens: 0 to 420 tok/s in
5 s slices). The run is judged only once a whole batch has ended since it filled (the rate then
spans a wave), a fifth of the window and MIN_SEEN_S have gone, and the rate spans MIN_RATE_S.
The rest may still run faster than the part seen, so the run is cut only when even

    high = (tokens(t) + rate * (1 + DRIFT) * (W - t)) / W

is below the score to beat by more than the run-to-run noise: high * (1 + NOISE) < target.

Measured by running this `Cutter` on the simulator's engine (Llama-8B on 32 GB, Llama-70B TP4
multi-turn, Kimi TP8 shared prefix at 90 s and 300 s windows; noisy starts; 2-10 server cells x
5 concurrencies): at the first judgeable moment the final score was at most 1.075 x
`projected`; the rest of a window ran at most 1.21 x the rate seen; `high` was never below the
final score. Without the turnover condition the final reached 2.3 x the projection (Kimi at
high concurrency: a wave ends at once and the next prefills); with the rate since the first
token, 6 x (Llama-70B: chunked prefill admits streams gradually). A window too short to turn
its batch over (the demo's 6 s; Kimi at high concurrency in 90 s) is never cut for its score.

A run is also cut when its p99 TTFT has already missed its limit whatever the rest does: more
than 1% of the most requests its window can count waited beyond it (a wait only grows). The
most: those started, a whole batch more, and those the rest can start. A closed loop starts a
request only when one ends, and by time t its slots have turned over at most (ended + in
flight) / t a second, counting every request in flight as ended now; the rest is allowed
SLOT_SPEEDUP times that (a first turnover carries every stream's prefill at once). This needs
no turnover and no score to beat, so it applies from the first second a wait passes the limit,
in windows too short to turn a batch over (a queue past the pool: Kimi TP8 at 90 s, 1,024-token
answers in 30 s). Replayed on whole windows of the simulator's engine
(tests/bench/bench_ttft_cut.py: Llama-8B 6 s and 30 s windows, Llama-70B TP4 multi-turn, Kimi TP8
at 90 s and 300 s; 3 noisy starts x 2-3 pools x 5-10 concurrencies):
no run whose p99 TTFT held was ever cut (134; the nearest, at 0.9 of its limit, reached 0.36 of
the cut's threshold); of the 136 that missed, those that missed by more than 3% were all cut, at
0.10-0.62 of their window; one at 1.01 of its limit was not.

What is cut, and against what (trial/inner.py): a run that cannot beat the larger of the
study's best score and its server's best point so far. A cut run is recorded as cut: its
projection steers the inner search (a climb goes on past a cut point that gains), never the
pooled curve, a confirmation or the export. A server whose every run was cut cannot beat the
study's best: its trial is `Status.CUT`, its value the best projection (what the sampler learns,
labelled as such), and no full window is spent to score a server that cannot win. A run cut for
its TTFT before any projection carries the rate it had so far.

Optuna's pruners (median, percentile, Wilcoxon) compare a trial's intermediate values with other
trials' at the same step. The unit cut here is one load run inside a trial, and the trial's
score is the best of its runs: pruning the trial would drop its measured points from TPE's model
(optuna ranks a pruned trial below every complete one, whatever it measured), so this rule is
the tuner's own. It applies to `window_output_throughput`, the score the progress counts; a
study scored on another metric runs every window in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.loadgen.result import LoadProgress

#: how much faster than the rate so far the rest of a window may run (see the module docstring)
DRIFT = 0.25
#: the run-to-run spread of one configuration's window score a cut must clear
NOISE = 0.05
#: a run is not judged before this share of its window ...
MIN_SHARE = 0.2
#: ... nor before this many seconds, nor with a rate of fewer seconds than MIN_RATE_S
MIN_SEEN_S = 10.0
MIN_RATE_S = 5.0
#: the metric whose window the progress measures
CUT_METRIC = "window_output_throughput"
#: a p99 misses its limit once more than this share of the window's requests are beyond it
P99_SHARE = 0.01
#: how much faster than the run so far the rest of a window may turn its slots over (TTFT cut)
SLOT_SPEEDUP = 4.0


@dataclass
class Cutter:
    """One load run's early stop: `cut(progress)` returns why the run cannot beat `target`
    (then the run stops as cut), else None; `projected` is the latest projection (tok/s)."""

    target: float | None  # the score to beat (tok/s); None: only the TTFT limit can cut
    window_s: float
    concurrency: int
    ttft_limit_ms: float | None = None  # objective.slo.p99_ttft_ms
    #: (when, tokens, requests ended, requests streaming) as the batch was first full
    full: tuple[float, int, int, int] | None = None
    widest: int = 0  # the most requests seen streaming at once
    projected: float | None = None
    at_s: float | None = None  # when the run was cut

    def project(self, p: LoadProgress) -> tuple[float, float] | None:
        """(projected, optimistic) final score of the run, or None while it ramps up."""
        self.widest = max(self.widest, p.streaming)
        if self.full is None and self._filled(p):
            self.full = (p.elapsed_s, p.output_tokens, p.done, p.streaming)
        if self.full is None:
            return None
        since, base, ended, batch = self.full
        rate_s = p.elapsed_s - since
        if rate_s < MIN_RATE_S or p.elapsed_s < max(MIN_SHARE * self.window_s, MIN_SEEN_S):
            return None
        if p.done - ended < max(batch, 1):  # the rate must span a whole turnover of the batch
            return None
        rate = (p.output_tokens - base) / rate_s
        rest = max(self.window_s - p.elapsed_s, 0.0)
        projected = (p.output_tokens + rate * rest) / self.window_s
        return projected, (p.output_tokens + rate * (1 + DRIFT) * rest) / self.window_s

    def cut(self, p: LoadProgress) -> str | None:
        got = self.project(p)
        why = self._missed(p)
        if got is None:
            if why is not None:  # no projection yet: the rate so far steers the search
                self.projected = p.output_tokens / max(p.elapsed_s, 1e-9)
                self.at_s = p.elapsed_s
            return why
        self.projected, high = got
        if why is None and self.target is not None and high * (1 + NOISE) < self.target:
            why = (
                f"cut at {p.elapsed_s:.0f} of {self.window_s:.0f} s: projected "
                f"{self.projected:.1f} tok/s, at most {high:.1f}, cannot beat {self.target:.1f}"
            )
        if why is not None:
            self.at_s = p.elapsed_s
        return why

    def _missed(self, p: LoadProgress) -> str | None:
        """Why the window's p99 TTFT will miss its limit whatever the rest does: more than 1% of
        the most requests it can count already waited beyond it (a wait only grows). The most:
        those started, a whole batch, and those the rest can start with its slots turning over
        SLOT_SPEEDUP times as fast as they did so far (every request in flight counted ended)."""
        if not self.ttft_limit_ms or not p.first_waits or p.elapsed_s <= 0:
            return None
        limit = self.ttft_limit_ms / 1000
        beyond = sum(1 for w in p.first_waits if w > limit)
        if not beyond:
            return None
        rate = (p.done + self.concurrency) / p.elapsed_s
        rest = max(self.window_s - p.elapsed_s, 0.0)
        most = len(p.first_waits) + rate * SLOT_SPEEDUP * rest + self.concurrency
        if beyond <= P99_SHARE * most + 1:
            return None
        return (
            f"cut at {p.elapsed_s:.0f} of {self.window_s:.0f} s: {beyond} requests waited beyond "
            f"the p99 TTFT limit {self.ttft_limit_ms:g} ms, more than 1% of the at most "
            f"{most:.0f} its window can count: it misses the limit"
        )

    def _filled(self, p: LoadProgress) -> bool:
        """Past the first prefill: every stream has had a token, or (a pool that admits fewer
        than the streams) as many requests ended as ever streamed at once."""
        return p.done + p.streaming >= self.concurrency or (p.done > 0 and p.done >= self.widest)


def cutter(
    metric: str,
    window_s: float | None,
    concurrency: int,
    target: float | None,
    ttft_limit_ms: float | None = None,
) -> Cutter | None:
    """A run's `Cutter`, or None when nothing can cut it: no window (a run bounded by its
    request count), and neither a score to beat (another metric, or nothing measured yet) nor
    a p99 TTFT limit."""
    beat = target if metric == CUT_METRIC and target and target > 0 else None
    if not window_s or (beat is None and not ttft_limit_ms):
        return None
    return Cutter(beat, float(window_s), max(int(concurrency), 1), ttft_limit_ms)
