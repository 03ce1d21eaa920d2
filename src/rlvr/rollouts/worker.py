"""Rollouts for training: `RolloutWorker` runs the environment's own rollout code against the
run's vf-vllm servers in a background thread, at most `batch.async_level` steps ahead of the
trainer. It decides which weight version generates each batch and which prompts a batch takes
(in order, past prompts too long to train on and those the curriculum sets aside, groups without
signal replaced under `batch.dynamic_sampling`), and runs the evaluations beside training.
Design: docs/architecture.md; versions: docs/training.md#precision-seeds-and-policy-lag.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rlvr.batch import GroupResult, StepBatch
from rlvr.config import Config, SamplingConfig
from rlvr.rollouts.curriculum import Curriculum
from rlvr.rollouts.eval_result import EvalResult
from rlvr.rollouts.groups import EveryRolloutErroredError, run_group
from rlvr.rollouts.handoff import Batches, VersionClock
from rlvr.rollouts.health import HealthWatch
from rlvr.rollouts.mixture import Routed, is_group, leaves, mixture_entry, prompt_order, route
from rlvr.rollouts.request_args import build_sampling_args, request_seed
from rlvr.rollouts.router import Attempt, Router
from rlvr.rollouts.servers import Server, ServerPool

if TYPE_CHECKING:
    from rlvr.distill.teacher import Teacher

log = logging.getLogger(__name__)


@dataclass
class _Prompts:
    """The rows a step (or a refill) generates from, and the rows it passed over."""

    first: int
    """The position of the first row in the prompt order."""
    rows: list[dict] = field(default_factory=list)
    too_long: int = 0
    set_aside: int = 0
    """Rows the curriculum passed over."""


@dataclass
class _Refill:
    """What dynamic sampling generated for one step beyond its first groups."""

    groups: int = 0
    zero_signal: int = 0
    """Groups of the step, first ones included, that carried no signal."""
    too_long: int = 0
    set_aside: int = 0


def row_id(row: dict, index: int) -> int:
    """The example id a dataset row's rollouts report (verifiers numbers the rows)."""
    return int(row.get("example_id", index))


class RolloutWorker:
    """Generates step batches in a background thread, at most `async_level` steps ahead.

    Batch s starts with weight version max(0, s - async_level) (version v: the weights after v
    optimizer steps) once the server holds it, and the trainer publishes no newer version
    (`publishing`, through the worker's `clock`) before that batch has started. Batches in
    flight at a checkpoint come back through `preloaded`. What merged pushes and adapter sync
    each guarantee: docs/training.md#precision-seeds-and-policy-lag.
    """

    def __init__(
        self,
        env: Any,
        dataset: Any,
        config: Config,
        client_factory: Callable[[str], Any],
        start_step: int = 0,
        version: int = 0,
        data_position: int = 0,
        prompt_fits: Callable[[dict], bool] | None = None,
        preloaded: list[StepBatch] | None = None,
        curriculum_state: dict[int, float] | None = None,
        served_name: Callable[[int], str] | None = None,
        pool: ServerPool | None = None,
        teacher: Teacher | None = None,
    ):
        self.env = env
        self.dataset = dataset
        self.cfg = config
        self.client_factory = client_factory
        """A rollout client (`rlvr.rollouts.client.RolloutClient`) on the server at a URL."""
        self.pool = pool or ServerPool(config.server.urls)
        self.router = Router(self.pool)
        self.served_name = served_name or (lambda version: config.served_model)
        """The model name that serves weight version v to rollouts: one name whatever the
        version (merged pushes), or that version's adapter (`rlvr.weight_sync.base`)."""
        self.order = prompt_order(env, dataset, config)
        self._sampling = {
            entry.label: replace(config.sampling, max_tokens=entry.max_tokens)
            for entry in config.envs
            if entry.max_tokens is not None
        }
        """A mixture environment's own reply length, by its name."""
        self.start_step = start_step
        self.position = data_position
        self.prompt_fits = prompt_fits or (lambda row: True)
        self.curriculum = None
        if config.curriculum.enabled:
            rates = dict(curriculum_state or {})
            self.curriculum = Curriculum(config.curriculum, config.seed, rates)
        self.teacher = teacher
        """On-policy distillation's teacher: it grades each training group as it finishes."""
        self._generated_at = 0.0  # when the step's last group finished generating
        self.clock = VersionClock(version)
        self._batches = Batches()
        self._preloaded = {b.step: b for b in preloaded or []}
        self._loop = asyncio.new_event_loop()
        self._version_event: asyncio.Event | None = None
        self._clients: dict[int, Any] = {}
        self._counted = self.pool.counters()
        """The servers' totals when the last step's metrics were taken: each step counts from
        there, so what happens between steps (a server joining at a push) counts too."""
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-worker", daemon=True)

    # -- trainer-side API -------------------------------------------------------------

    def start(self) -> RolloutWorker:
        self._thread.start()
        self._ready.wait()
        return self

    @contextmanager
    def publishing(
        self,
        version: int,
        release: Callable[[set[int]], None],
        timeout_s: float | None = None,
    ) -> Iterator[None]:
        """The block pushes weight `version`; afterwards the clock reads `version`, waiting
        batches may start with it, and `release` gets the versions rollouts still request.

        The block begins once the batch the previous version generates (step version - 1 +
        async_level) has started, so every batch's policy version is fixed; steps beyond the
        run have nothing to wait for. A push that raises leaves the clock where it was."""
        step = version - 1 + self.cfg.batch.async_level
        if step < self.cfg.max_steps:
            self._batches.wait_started(step, timeout_s)
        self.clock.pushing = max(self.clock.pushing, version)
        yield
        self.clock.advance(version)
        if self._version_event is not None:
            self._call_in_loop(self._version_event.set)
        release(self.clock.in_use())

    def get(self, step: int, timeout_s: float | None = None) -> StepBatch:
        """Block until the batch of `step` is ready (re-raises a worker failure); after
        `timeout_s`, raise TimeoutError instead of waiting on a stuck server forever."""
        return self._batches.take(step, timeout_s)

    def in_flight(self, first: int, timeout_s: float | None = None) -> list[StepBatch]:
        """For a checkpoint after `first` steps: the batches of steps first..first +
        async_level - 1 that are already generating (with policies older than the one
        being saved), waited for. A resumed run must not regenerate these with the newer
        policy; later batches start from the saved policy either way."""
        last = first + self.cfg.batch.async_level - 1
        return self._batches.in_flight(first, last, timeout_s)

    def evaluate(
        self, num_examples: int, rollouts_per_example: int, timeout_s: float | None = None
    ) -> EvalResult:
        """Run the environment's eval set on the worker's loop (beside training rollouts);
        cancelled with TimeoutError after `timeout_s`."""
        future = asyncio.run_coroutine_threadsafe(
            self._evaluate(num_examples, rollouts_per_example), self._loop
        )
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"evaluation did not finish within {timeout_s:.0f}s (distributed.timeout_s "
                "bounds it: the other ranks wait for it); lower eval.num_examples"
            ) from None

    def close(self) -> None:
        if self._thread.is_alive():
            if self._task is not None:
                self._call_in_loop(self._task.cancel)
            self._thread.join(timeout=60)

    def _call_in_loop(self, callback: Callable[[], Any]) -> None:
        """Run `callback` on the worker's loop; nothing when the loop has already closed (the
        thread is ending: a failure of its own, or the last step, closed it between our check
        and this call), so that the failure the thread raised is what the caller sees."""
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:
            if not self._loop.is_closed():
                raise

    # -- worker thread ----------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:  # after the main task: `close` cancels that task alone, never its clean-up
            self._loop.run_until_complete(self._close_clients())
            self._loop.close()

    async def _main(self) -> None:
        self._version_event = asyncio.Event()
        self._task = asyncio.current_task()
        watch = self._watch_health()
        self._ready.set()
        try:
            for step in range(self.start_step, self.cfg.max_steps):
                if step in self._preloaded:  # started before the checkpoint: in flight still
                    self._batches.start(step)
                    batch = self._preloaded.pop(step)
                    self.position = batch.data_position
                    if self.curriculum is not None and batch.curriculum_state is not None:
                        self.curriculum.rates = dict(batch.curriculum_state)
                else:
                    await self._wait_for_version(step - self.cfg.batch.async_level)
                    with self.clock.lease() as version:  # before the trainer may push on
                        self._batches.start(step)
                        batch = await self.generate_step(step, version)
                self._batches.put(batch)
            await asyncio.Event().wait()  # stay up for evaluations until close()
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # handed to the trainer, which re-raises it
            log.exception("rollout worker failed")
            self._batches.fail(e)
        finally:
            if watch is not None:
                watch.cancel()

    async def _close_clients(self) -> None:
        for client in self._clients.values():
            await client.close()
        if self.teacher is not None:
            await self.teacher.aclose()

    def _client(self, server: Server) -> Any:
        """The client of `server`, made at its first group (servers join during a run)."""
        if server.index not in self._clients:
            self._clients[server.index] = self.client_factory(server.url)
        return self._clients[server.index]

    def _watch_health(self) -> asyncio.Task | None:
        """Start the health watch of the servers (`rlvr.rollouts.health`), unless turned off."""
        server = self.cfg.server
        if server.hang_s == 0:
            return None
        watch = HealthWatch(self.router, server.health_every_s, server.hang_s, server.api_key)
        return asyncio.ensure_future(watch.run())

    async def _wait_for_version(self, needed: int) -> None:
        assert self._version_event is not None
        while self.clock.current < needed:
            self._version_event.clear()
            if self.clock.current >= needed:
                return
            await self._version_event.wait()

    def _sampling_args(
        self, routed: Routed, step: int, position: int, rollout: int
    ) -> dict[str, Any]:
        seed = None
        if self.cfg.sampling.seed_requests:
            seed = request_seed(self.cfg.seed, step, position, rollout)
        return build_sampling_args(self._sampling_of(routed), routed.env.sampling_args, seed)

    def _sampling_of(self, routed: Routed) -> SamplingConfig:
        """The run's sampling settings, with a mixture environment's own reply length."""
        return self._sampling.get(routed.entry, self.cfg.sampling)

    async def _run_groups(
        self, rows: list[Routed], step: int, first_position: int, group_size: int, version: int
    ) -> list[GroupResult]:
        """Generate and score the groups of `rows`, each in its environment and on one server,
        every request through the model name that serves weight `version` there."""
        limit = self.cfg.batch.max_concurrent
        semaphore = asyncio.Semaphore(limit if limit > 0 else len(rows) or 1)

        async def one(i: int, routed: Routed) -> GroupResult:
            position = first_position + i
            args = [self._sampling_args(routed, step, position, r) for r in range(group_size)]

            def on_server(attempt: Attempt) -> Any:
                server = attempt.server
                return run_group(
                    routed.env,
                    self._client(server).with_attempt(attempt),
                    self.served_name(max(version, server.since)),
                    routed.row,
                    args,
                    self.cfg.batch.max_seq_len,
                    self.cfg.batch.mask_truncated,
                )

            async with semaphore:
                group = await self.router.run(version, on_server)
            group = replace(group, env=routed.name, reply_cap=args[0]["max_tokens"])
            if self.teacher is None or step < 0:  # evaluations are not graded
                return group
            self._generated_at = max(self._generated_at, time.perf_counter())
            return await self.teacher.grade(group)

        return list(await asyncio.gather(*(one(i, routed) for i, routed in enumerate(rows))))

    async def _run_prompts(
        self, prompts: _Prompts, step: int, group_size: int, version: int
    ) -> list[GroupResult]:
        """The groups of training prompts, each routed to its environment."""
        rows = [route(self.env, row) for row in prompts.rows]
        return await self._run_groups(rows, step, prompts.first, group_size, version)

    def _next_prompts(self, count: int) -> _Prompts:
        """The next `count` rows whose prompts fit and that the curriculum keeps."""
        prompts = _Prompts(first=self.position)
        while len(prompts.rows) < count:
            (index,) = self.order.rows(self.position, 1)
            position = self.position
            self.position += 1
            row = self.dataset[index]
            if not self.prompt_fits(row):
                prompts.too_long += 1
                if prompts.too_long > len(self.dataset):
                    raise RuntimeError(
                        f"no prompt of the dataset fits batch.max_prompt_len="
                        f"{self.cfg.batch.max_prompt_len} tokens"
                    )
            elif self.curriculum is not None and not self.curriculum.keeps(
                row_id(row, index), position
            ):
                prompts.set_aside += 1
            else:
                prompts.rows.append(row)
        return prompts

    async def generate_step(self, step: int, version: int) -> StepBatch:
        """The batch of `step`, every request through the name serving weight `version`
        (refills included: the whole batch is generated by one policy)."""
        prompts = self._next_prompts(self.cfg.examples_per_step)
        began = self._generated_at = time.perf_counter()
        graded = self.teacher.seconds if self.teacher is not None else 0.0
        retried = self.router.retried_groups
        request_errors = self.router.request_errors
        group_size = self.cfg.batch.rollouts_per_example
        groups = await self._run_prompts(prompts, step, group_size, version)
        self._observe(groups)
        refill = await self._refill(groups, step, version)
        errors = [e for g in groups for e in g.errors]
        if groups and not any(g.rollouts for g in groups):
            raise EveryRolloutErroredError(step, errors)
        for message in errors[:3]:
            log.warning("step %d: rollout errored: %s", step, message)
        newest = self.clock.pushing
        if self.served_name(newest) != self.served_name(version):
            newest = version  # only a push under the same name serves the batch's later requests
        done = time.perf_counter()
        seconds = done - began
        counted, self._counted = self._counted, self.pool.counters()
        teacher_s = self.teacher.seconds - graded if self.teacher is not None else 0.0
        return StepBatch(
            step,
            groups,
            data_position=self.position,
            skipped_prompts=prompts.too_long + refill.too_long,
            generate_s=seconds,
            min_policy_version=version,
            errors=errors,
            max_policy_version=newest,
            refill_groups=refill.groups,
            zero_signal_groups=refill.zero_signal,
            set_aside_prompts=prompts.set_aside + refill.set_aside,
            curriculum_state=None if self.curriculum is None else self.curriculum.snapshot(),
            retried_groups=self.router.retried_groups - retried,
            request_errors=self.router.request_errors - request_errors,
            servers=self.pool.metrics(counted, self._counted, seconds),
            teacher_s=teacher_s,
            teacher_wait_s=done - self._generated_at if self.teacher is not None else 0.0,
        )

    def _observe(self, groups: list[GroupResult]) -> None:
        if self.curriculum is not None:
            self.curriculum.observe(groups)

    async def _refill(self, groups: list[GroupResult], step: int, version: int) -> _Refill:
        """Under `batch.dynamic_sampling`, replace (in place) the groups without signal with
        groups of the next prompts, round after round, until all carry signal or
        `batch.max_refill_rounds` rounds are spent; counts what it generated."""
        batch = self.cfg.batch
        refill = _Refill(zero_signal=sum(not self._carries_signal(g) for g in groups))
        for _ in range(batch.max_refill_rounds if batch.dynamic_sampling else 0):
            empty = [i for i, g in enumerate(groups) if not self._carries_signal(g)]
            if not empty:
                break
            prompts = self._next_prompts(len(empty))
            fresh = await self._run_prompts(prompts, step, batch.rollouts_per_example, version)
            self._observe(fresh)
            for i, group in zip(empty, fresh, strict=True):
                groups[i] = group
            refill.groups += len(fresh)
            refill.zero_signal += sum(not self._carries_signal(g) for g in fresh)
            refill.too_long += prompts.too_long
            refill.set_aside += prompts.set_aside
        return refill

    def _carries_signal(self, group: GroupResult) -> bool:
        """The group trains: not too errored, and its rewards differ or a teacher grades it."""
        limit = self.cfg.batch.max_errored_frac
        if self.teacher is not None:
            return not group.too_errored(limit)
        return group.carries_signal(limit)

    async def _evaluate(self, num_examples: int, rollouts_per_example: int) -> EvalResult:
        """The eval set of the environment, or of each environment of a mixture (its own
        `eval_examples` of its own eval set), with the same version throughout."""
        sizes = {entry.label: entry.eval_examples for entry in self.cfg.envs}
        bar = self.cfg.eval.pass_threshold
        per_env: dict[str, list[GroupResult]] = {}
        with self.clock.lease() as version:
            for name, env in leaves(self.env).items():
                n = sizes.get(mixture_entry(name)) or num_examples
                dataset = env.get_eval_dataset(n=n)
                rows = [Routed(env, dataset[i], name) for i in range(len(dataset))]
                per_env[name or ""] = await self._run_groups(
                    rows, -1, 0, rollouts_per_example, version
                )
        result = EvalResult.of([g for groups in per_env.values() for g in groups], bar)
        if is_group(self.env):
            result.per_env = {name: EvalResult.of(g, bar) for name, g in per_env.items()}
        return result
