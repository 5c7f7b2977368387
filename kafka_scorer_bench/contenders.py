"""The in-process contenders (a), (b) and (c), and the closed-loop client that times all three alike.

One driver for every in-process contender, so a difference between their figures is a difference
between the scorers, not between the ways they were fed: `window` jobs outstanding (enough to fill two
token budgets), the next submitted as soon as one is answered. Wall time runs from the first submission
to the last answer. By Little's law latency is then about window / throughput: p50/p99 tell how evenly
jobs are served, the throughput columns tell the speed.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence

import msgspec

from kafka_scorer.wire.protocol import Job, Result
from kafka_scorer_bench.baseline import BaselineScorer
from kafka_scorer_bench.probes import RunProbe
from kafka_scorer_bench.records import RunLog, RunRecord, Scores, error_text, repeated
from kafka_scorer_bench.workloads import Workload

Answer = tuple[int, Scores | None, str | None]
"""(job index, scores or None, error or None)."""


class Contender:
    """A synchronous scorer driven by `drive`: jobs are submitted, `step` answers some of them."""

    def submit(self, index: int, job: Job) -> None:
        raise NotImplementedError

    def step(self) -> list[Answer]:
        """Run one unit of work; an answer for each job it finished."""
        raise NotImplementedError

    forward_tokens = 0
    lm_head_rows = 0


class EngineContender(Contender):
    """The engine's `prepare` on submission (as the worker does), then one `run_batch` per token budget.

    `layers` runs the Scorer with other decoder layers for the contender (transformers' own, or the
    fused ones eager), on the same weights; `backend` with another MIS attention backend."""

    def __init__(self, scorer, backend: str | None, layers: str = "served") -> None:
        from kafka_scorer.engine.api import Layers, TokenBudgetScheduler, variant

        self.engine = scorer.engine
        self.variant = variant(scorer.describe().loaded, backend, Layers(layers))
        self.scheduler = TokenBudgetScheduler(self.engine.max_batch_tokens)
        self.index_of: dict[str, int] = {}
        self.ready: list[Answer] = []
        self.causal = scorer.describe().loaded.architecture.value == "causal_lm"

    def submit(self, index: int, job: Job) -> None:
        job_id = f"{index}"
        self.index_of[job_id] = index
        prepared = self.engine.prepare(job, job_id)
        if isinstance(prepared, Result):
            self.ready.append(self._answer(prepared))
        else:
            self.scheduler.add(prepared)

    def step(self) -> list[Answer]:
        done, self.ready = self.ready, []
        batch = self.scheduler.next_batch()
        if not batch:
            return done
        with self.engine.running(self.variant):
            results = self.engine.run_batch(batch)
        for prepared, result in zip(batch, results):
            self.forward_tokens += result.prompt_tokens
            if self.causal and not prepared.job.apply_softmax:
                self.lm_head_rows += prepared.num_items
            done.append(self._answer(result))
        return done

    def _answer(self, result: Result) -> Answer:
        return self.index_of[result.id], result.scores, error_text(result)


class BaselineContender(Contender):
    """Takes queued jobs while their padded pairs fit one token budget, then scores them batch by batch."""

    def __init__(self, baseline: BaselineScorer, max_batch_tokens: int) -> None:
        self.baseline = baseline
        self.max_batch_tokens = max_batch_tokens
        self.queue: deque[tuple[int, Job]] = deque()

    def submit(self, index: int, job: Job) -> None:
        self.queue.append((index, job))

    def step(self) -> list[Answer]:
        taken: list[tuple[int, Job]] = []
        tokens = 0
        while self.queue:
            _, job = self.queue[0]
            cost = len(job.items) * max((len(job.query) + len(i) for i in job.items), default=0)
            if taken and tokens + cost > self.max_batch_tokens:
                break
            taken.append(self.queue.popleft())
            tokens += cost
        jobs = [job for _, job in taken]
        scores: list[Scores] = [[[] for _ in job.items] for job in jobs]
        remaining = [len(job.items) for job in jobs]
        done: list[Answer] = [(index, [], None) for (index, job) in taken if not job.items]
        for rows in self.baseline.plan(jobs, self.max_batch_tokens):
            batch_scores, padded = self.baseline.score_rows(jobs, rows)
            self.forward_tokens += padded
            if self.baseline.causal:
                self.lm_head_rows += padded
            for (j, i), row in zip(rows, batch_scores):
                scores[j][i] = row
                remaining[j] -= 1
                if remaining[j] == 0:
                    done.append((taken[j][0], scores[j], None))
        return done


class OneJobAtATime(Contender):
    """A library's own call per job, as its users write it: jobs in submission order, one per step."""

    def __init__(self) -> None:
        self.queue: deque[tuple[int, Job]] = deque()

    def submit(self, index: int, job: Job) -> None:
        self.queue.append((index, job))

    def step(self) -> list[Answer]:
        index, job = self.queue.popleft()
        return [(index, self.score(job), None)]

    def score(self, job: Job) -> Scores:
        """One row of scores per item of `job`."""
        raise NotImplementedError


def drive(contender: Contender, jobs: Sequence[Job], window: int, probe: RunProbe) -> RunRecord:
    """The closed-loop client: `window` jobs outstanding, the next submitted as soon as one is answered."""
    n = len(jobs)
    log = RunLog(n)
    with probe.measure() as peak:
        start = time.perf_counter()
        next_job = outstanding = 0

        def fill() -> None:
            nonlocal next_job, outstanding
            while outstanding < window and next_job < n:
                log.submit(next_job)
                contender.submit(next_job, jobs[next_job])
                next_job += 1
                outstanding += 1

        fill()
        while outstanding:
            finished = contender.step()
            now = time.perf_counter()
            if not finished:
                raise RuntimeError(f"{type(contender).__name__} made no progress with {outstanding} jobs out")
            for index, job_scores, error in finished:
                log.answer(index, job_scores, error, now)
                outstanding -= 1
            fill()
        wall = time.perf_counter() - start
    return log.record(wall, contender.forward_tokens, contender.lm_head_rows, peak)


def timed(
    make: Callable[[], Contender],
    jobs: Sequence[Job],
    window: int,
    probe: RunProbe,
    repeats: int,
    budget_s: float,
) -> RunRecord:
    """A fresh contender per run: one warm-up on a slice of `jobs`, then `repeated` timed runs."""
    drive(make(), warmup_jobs(jobs), window, probe)
    return repeated(lambda _: drive(make(), jobs, window, probe), repeats, budget_s)


def warmup_jobs(jobs: Sequence[Job], count: int = 2, max_items: int = 4) -> list[Job]:
    """A small slice of the workload with the same structure: first calls pay their one-off costs here."""
    return [
        msgspec.structs.replace(job, id=f"warmup-{job.id}", items=job.items[:max_items])
        for job in list(jobs)[:count]
    ]


def window_for(workload: Workload, max_batch_tokens: int) -> int:
    """Jobs outstanding: enough MIS-packed jobs to fill two token budgets (at least 2)."""
    per_job = workload.packed_tokens / max(1, len(workload.jobs))
    return max(2, math.ceil(2 * max_batch_tokens / max(per_job, 1)))
