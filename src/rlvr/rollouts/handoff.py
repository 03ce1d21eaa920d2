"""What the rollout worker's thread and the trainer share: the step batches on their way
(`Batches`) and the run's policy version (`VersionClock`), each behind its own lock.

Which version generates which batch, and why a checkpoint keeps the batches in flight:
docs/training.md#precision-seeds-and-policy-lag and docs/training.md#resuming-asynchronous-runs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rlvr.batch import StepBatch
from rlvr.distill.teacher import TeacherError
from rlvr.rollouts.groups import EveryRolloutErroredError
from rlvr.rollouts.servers import NoServerLeftError

TOLD_IN_FULL = (NoServerLeftError, TeacherError, EveryRolloutErroredError)
"""Worker failures raised to the trainer as they are: their message says all there is to say
(each server and its last answer; the teacher and each try's answer; a step's first errors)."""


class Batches:
    """Finished step batches on their way from the worker thread to the trainer, and the steps
    whose generation has started (a checkpoint keeps the batches in flight)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.ready: dict[int, StepBatch] = {}
        self.started: set[int] = set()
        self.failure: BaseException | None = None

    def start(self, step: int) -> None:
        with self._cond:
            self.started.add(step)
            self._cond.notify_all()

    def put(self, batch: StepBatch) -> None:
        with self._cond:
            self.ready[batch.step] = batch
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self.failure = error
            self._cond.notify_all()

    def _wait(self, done: Callable[[], bool], timeout_s: float | None, what: str) -> None:
        """Wait until `done()` (under the lock); re-raise a worker failure; time out clearly."""
        if not self._cond.wait_for(lambda: done() or self.failure is not None, timeout_s):
            raise TimeoutError(
                f"no rollouts for {what} after {timeout_s:.0f}s: the server is stuck or "
                "generation is slower than distributed.timeout_s allows (raise it, or lower "
                "batch.batch_size / sampling.max_tokens)"
            )
        if isinstance(self.failure, TOLD_IN_FULL):
            raise self.failure
        if self.failure is not None and not done():
            raise RuntimeError("the rollout worker failed") from self.failure

    def wait_started(self, step: int, timeout_s: float | None) -> None:
        with self._cond:
            self._wait(lambda: step in self.started, timeout_s, f"the start of step {step}")

    def take(self, step: int, timeout_s: float | None) -> StepBatch:
        with self._cond:
            self._wait(lambda: step in self.ready, timeout_s, f"step {step}")
            return self.ready.pop(step)

    def in_flight(self, first: int, last: int, timeout_s: float | None) -> list[StepBatch]:
        """The batches of steps first..last whose generation has started, once finished."""
        with self._cond:
            steps = sorted(s for s in self.started if first <= s <= last)
            self._wait(lambda: all(s in self.ready for s in steps), timeout_s, f"steps {steps}")
            return [self.ready[s] for s in steps]


class VersionClock:
    """The policy version of a run: the newest weight version the server holds (`current`),
    the newest whose push may have begun (`pushing`), and the versions batches and evaluations
    are generating with.

    A version is taken (`lease`) and registered in one locked step, so once the trainer has
    moved to a newer version, `in_use` names every older one a request can still ask for: an
    adapter push may unload the rest."""

    def __init__(self, current: int):
        self._lock = threading.Lock()
        self.current = current
        self.pushing = current
        self._leases: Counter[int] = Counter()

    def advance(self, version: int) -> None:
        with self._lock:
            self.current = version

    @contextmanager
    def lease(self) -> Iterator[int]:
        """The current version, kept in use until the block ends."""
        with self._lock:
            version = self.current
            self._leases[version] += 1
        try:
            yield version
        finally:
            with self._lock:
                self._leases[version] -= 1
                if not self._leases[version]:
                    del self._leases[version]

    def in_use(self) -> set[int]:
        """Leased versions and the current one (which the next batch takes)."""
        with self._lock:
            return {self.current, *self._leases}
