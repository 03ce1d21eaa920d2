"""Rollouts for training: the environment's own rollout code against vf-vllm, run ahead of the
trainer in a background thread, and turned into token samples with loss masks.

Client. vLLM 0.32 has no `/v1/chat/completions/tokens` route, so verifiers'
`OpenAIChatCompletionsTokenClient` fails from the second turn on. We use the plain
`OpenAIChatCompletionsClient` (messages in, so every environment works unchanged) and ask vLLM
for `logprobs` and `return_token_ids`: it then returns `prompt_token_ids` and each choice's
`token_ids`, which verifiers' own response parser stores in `trajectory[i]["tokens"]`.

Samples: per trajectory when possible, per turn where needed. A multi-turn rollout becomes one
sample when each turn's prompt ids start with the previous turn's prompt + completion ids (the
usual case with ChatML templates): the environment's tokens between turns (tool results, user
or opponent messages) are then part of the sequence with loss mask 0, and one forward pass
trains every turn with the exact context the sampler saw. Where re-rendering the conversation
changes earlier tokens (a template that drops reasoning, a tool call re-serialised differently
from how it was sampled, BPE merging across the turn boundary), a new sample starts at that
turn: merging would train on a context the sampler never saw. Either way the ids are exactly
those vLLM reported, never re-tokenized text.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlvr.batch import Sample
from rlvr.config import Config, SamplingConfig

log = logging.getLogger(__name__)

# Sampling fields that make vLLM return what training needs: token ids of prompt and
# completion, and the sampler's log-probability of every generated token.
TOKEN_SAMPLING_ARGS: dict[str, Any] = {"logprobs": True, "extra_body": {"return_token_ids": True}}


class MissingTokensError(RuntimeError):
    """The server did not return token ids / logprobs, so nothing can be trained."""


def make_client(base_url: str, api_key: str | None, timeout_s: float, max_connections: int):
    """A verifiers chat client on vf-vllm.

    Idle connections are dropped before uvicorn's 5 s keep-alive timeout (reusing one the
    server is closing fails with a read error), and connection errors are retried; a request
    that still fails makes an errored rollout, which is counted."""
    import httpx
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    http = httpx.AsyncClient(
        limits=httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=64, keepalive_expiry=3.0
        ),
        timeout=httpx.Timeout(timeout_s, connect=10.0),
    )
    oai = AsyncOpenAI(
        base_url=base_url, api_key=api_key or "EMPTY", max_retries=2, http_client=http
    )
    return OpenAIChatCompletionsClient(oai)


def build_sampling_args(
    cfg: SamplingConfig, env_defaults: dict[str, Any] | None = None, seed: int | None = None
) -> dict[str, Any]:
    """The environment's own sampling defaults, then ours, then the token-return fields (those
    must win: training cannot run without them). `extra_body` is merged key by key."""
    args: dict[str, Any] = {k: v for k, v in (env_defaults or {}).items() if k != "extra_body"}
    args.update(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens)
    args.pop("n", None)
    if seed is not None:
        args["seed"] = seed
    args["logprobs"] = True
    args["extra_body"] = {
        **(env_defaults or {}).get("extra_body", {}),
        **cfg.extra_body,
        **TOKEN_SAMPLING_ARGS["extra_body"],
    }
    return args


def request_seed(seed: int, step: int, position: int, rollout: int) -> int:
    """A per-rollout sampling seed: distinct across rollouts of a group (else they would be
    identical), identical across reruns of the same step (so a resumed run samples the same)."""
    value = seed
    for part in (step, position, rollout):
        value = (value * 1_000_003 + part + 1) % 2_147_483_647
    return value


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """Messages are pydantic objects at run time and dicts in saved results: read both."""
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def message_text(message: Any) -> str:
    content = _get(message, "content")
    if isinstance(content, list):
        content = " ".join(str(_get(part, "text", "")) for part in content)
    text = content or ""
    for call in _get(message, "tool_calls") or []:
        text += f"\n[tool_call {_get(call, 'name')}({_get(call, 'arguments')})]"
    return text


def render_messages(messages: Any, limit: int = 2000) -> str:
    """Readable text for the sample table: `role: text` per message, cut to `limit` chars."""
    if isinstance(messages, str):
        return messages[:limit]
    lines = [f"{_get(m, 'role')}: {message_text(m)}" for m in messages or []]
    return "\n".join(lines)[:limit]


def prompt_length_filter(
    tokenizer: Any, max_len: int, tool_defs: list | None = None
) -> Callable[[dict], bool]:
    """A predicate: does this dataset row's prompt, rendered with the chat template (and the
    environment's tools), fit in `max_len` tokens?"""
    tools = [
        {
            "type": "function",
            "function": {
                "name": _get(t, "name"),
                "description": _get(t, "description"),
                "parameters": _get(t, "parameters"),
            },
        }
        for t in tool_defs or []
    ] or None

    def fits(row: dict) -> bool:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        messages = [{"role": _get(m, "role"), "content": _get(m, "content")} for m in prompt]
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return len(tokenizer.encode(text, add_special_tokens=False)) <= max_len

    return fits


def trajectory_samples(trajectory: list[dict], max_seq_len: int) -> list[Sample]:
    """Turn a rollout's trajectory into samples (see the module docstring for when turns are
    merged). Loss mask 1 only on completion tokens the sampler produced (and that the
    environment's completion mask keeps); everything else, including every prompt, system,
    user and tool token, gets 0."""
    samples: list[Sample] = []
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for turn, step in enumerate(trajectory):
        tokens = step.get("tokens")
        if tokens is None:
            raise MissingTokensError(
                f"turn {turn} of a rollout has no token data: the server must return "
                "prompt_token_ids/token_ids and logprobs (vLLM with return_token_ids)"
            )
        prompt = list(tokens["prompt_ids"])
        completion = list(tokens["completion_ids"])
        completion_mask = list(tokens.get("completion_mask") or [1] * len(completion))
        completion_logprobs = [float(x) for x in tokens["completion_logprobs"]]
        if len(completion_logprobs) != len(completion):
            raise MissingTokensError(
                f"turn {turn}: {len(completion)} completion ids but "
                f"{len(completion_logprobs)} logprobs"
            )
        extends = (
            bool(ids) and prompt[: len(ids)] == ids and len(prompt) + len(completion) <= max_seq_len
        )
        if not extends and ids:
            samples.append(Sample(ids, mask, logprobs))
            ids, mask, logprobs = [], [], []
        new_prompt = prompt[len(ids) :]
        ids = ids + new_prompt + completion
        mask = mask + [0] * len(new_prompt) + [int(bool(m)) for m in completion_mask]
        logprobs = logprobs + [0.0] * len(new_prompt) + completion_logprobs
    if ids:
        samples.append(Sample(ids, mask, logprobs))
    return samples


@dataclass
class RolloutResult:
    """One finished rollout, reduced to what training and logging need."""

    example_id: int
    reward: float
    metrics: dict[str, float]
    samples: list[Sample]
    truncated: bool
    num_turns: int
    completion_tokens: int
    prompt_text: str
    completion_text: str
    answer: str = ""


def rollout_result(state: Any, max_seq_len: int, mask_truncated: bool) -> RolloutResult:
    trajectory = state.get("trajectory") or []
    truncated = bool(state.get("is_truncated")) or any(
        step.get("is_truncated") for step in trajectory
    )
    samples = trajectory_samples(trajectory, max_seq_len)
    if truncated and mask_truncated:
        samples = []
    completion_tokens = sum(
        len((s.get("tokens") or {}).get("completion_ids", [])) for s in trajectory
    )
    return RolloutResult(
        example_id=int(state.get("example_id", 0)),
        reward=float(state.get("reward") or 0.0),
        metrics={k: float(v) for k, v in (state.get("metrics") or {}).items()},
        samples=samples,
        truncated=truncated,
        num_turns=len(trajectory),
        completion_tokens=completion_tokens,
        prompt_text=render_messages(state.get("prompt")),
        completion_text=render_messages(state.get("completion")),
        answer=str(state.get("answer", "") or ""),
    )


@dataclass
class GroupResult:
    """The rollouts of one prompt that finished without error, and how many errored."""

    rollouts: list[RolloutResult]
    errored: int = 0
    errors: list[str] = field(default_factory=list)


async def run_group(
    env: Any,
    client: Any,
    model: str,
    row: dict,
    sampling_args: list[dict[str, Any]],
    max_seq_len: int,
    mask_truncated: bool,
) -> GroupResult:
    """Generate and score one group (len(sampling_args) rollouts of `row`).

    Mirrors verifiers' own group runner (rollouts, then `rubric.score_group`, then cleanup)
    through public methods, because its public `run_group` returns serialised outputs without
    the token trajectory. A rollout that raises or ends with `state["error"]` is dropped and
    counted; the others are scored together.
    """
    results = await asyncio.gather(
        *(env.rollout(dict(row), client, model, args) for args in sampling_args),
        return_exceptions=True,
    )
    states = []
    errors = []
    for result in results:
        if isinstance(result, MissingTokensError):
            raise result
        if isinstance(result, BaseException):
            errors.append(f"{type(result).__name__}: {result}")
        elif result.get("error") is not None:
            errors.append(repr(result["error"]))
        else:
            states.append(result)
    if states:
        if env.score_rollouts:
            await env.rubric.score_group(states)
        else:
            await env.rubric.dummy_score_group(states)
    for state in states:
        await env.rubric.cleanup(state)
    rollouts = [rollout_result(s, max_seq_len, mask_truncated) for s in states]
    return GroupResult(rollouts, errored=len(errors), errors=errors)


class PromptOrder:
    """The order in which dataset rows are used: epoch e walks a permutation seeded by
    (seed, e). A position in this stream (saved in checkpoints) is all a resumed run needs to
    continue with exactly the rows the interrupted run would have used next."""

    def __init__(self, num_rows: int, seed: int):
        if num_rows < 1:
            raise ValueError("the environment's training dataset is empty")
        self.num_rows = num_rows
        self.seed = seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            import random

            perm = list(range(self.num_rows))
            random.Random(self.seed * 100_003 + epoch).shuffle(perm)
            self._perms = {epoch: perm}
        return self._perms[epoch]

    def rows(self, start: int, count: int) -> list[int]:
        return [
            self._perm(p // self.num_rows)[p % self.num_rows] for p in range(start, start + count)
        ]


@dataclass
class StepBatch:
    """All groups for one training step, with the bookkeeping the logs need."""

    step: int
    groups: list[GroupResult]
    data_position: int
    """Position in the prompt order after this batch (where the next batch starts)."""
    skipped_prompts: int
    """Rows passed over because their prompt is longer than batch.max_prompt_len."""
    generate_s: float
    """Wall time from starting the step's rollouts to the last group finishing."""
    min_policy_version: int
    """The weight version the server held when these rollouts started."""
    errors: list[str] = field(default_factory=list)

    @property
    def rollouts(self) -> list[RolloutResult]:
        return [r for g in self.groups for r in g.rollouts]

    @property
    def errored(self) -> int:
        return sum(g.errored for g in self.groups)

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.rollouts)


@dataclass
class EvalResult:
    reward: float
    metrics: dict[str, float]
    num_rollouts: int
    errored: int
    truncated: int


class RolloutWorker:
    """Generates step batches in a background thread, at most `async_level` steps ahead.

    Batch s may start once the server holds weight version >= s - async_level (version v =
    weights after v optimizer steps; version 0 is pushed before training starts). With
    async_level 0 every batch is generated by the weights it trains; with 1, batch s+1 is
    generated while step s trains, and the importance ratio corrects for the one-step lag.
    """

    def __init__(
        self,
        env: Any,
        dataset: Any,
        config: Config,
        client_factory: Callable[[], Any],
        start_step: int = 0,
        version: int = 0,
        data_position: int = 0,
        prompt_fits: Callable[[dict], bool] | None = None,
    ):
        self.env = env
        self.dataset = dataset
        self.cfg = config
        self.client_factory = client_factory
        self.order = PromptOrder(len(dataset), config.seed)
        self.start_step = start_step
        self.position = data_position
        self.prompt_fits = prompt_fits or (lambda row: True)
        self._version = version
        self._queue: queue.Queue[StepBatch | BaseException] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._version_event: asyncio.Event | None = None
        self._client: Any = None
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rollout-worker", daemon=True)

    # -- trainer-side API -------------------------------------------------------------

    def start(self) -> RolloutWorker:
        self._thread.start()
        self._ready.wait()
        return self

    def set_version(self, version: int) -> None:
        """Called by the trainer after each weight push."""
        self._version = version
        if self._version_event is not None:
            self._loop.call_soon_threadsafe(self._version_event.set)

    def get(self, step: int) -> StepBatch:
        """Block until the batch of `step` is ready (re-raises a worker failure)."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise RuntimeError("the rollout worker failed") from item
        if item.step != step:
            raise RuntimeError(f"rollout worker produced step {item.step}, expected {step}")
        return item

    def evaluate(self, num_examples: int, rollouts_per_example: int) -> EvalResult:
        """Run the environment's eval set on the worker's loop (beside training rollouts)."""
        future = asyncio.run_coroutine_threadsafe(
            self._evaluate(num_examples, rollouts_per_example), self._loop
        )
        return future.result()

    def close(self) -> None:
        if self._thread.is_alive():
            if self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
            self._thread.join(timeout=60)

    # -- worker thread ----------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._version_event = asyncio.Event()
        self._client = self.client_factory()
        self._task = asyncio.current_task()
        self._ready.set()
        try:
            for step in range(self.start_step, self.cfg.max_steps):
                await self._wait_for_version(step - self.cfg.batch.async_level)
                self._queue.put(await self.generate_step(step))
            await asyncio.Event().wait()  # stay up for evaluations until close()
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # handed to the trainer, which re-raises it
            log.exception("rollout worker failed")
            self._queue.put(e)
        finally:
            await self._client.close()

    async def _wait_for_version(self, needed: int) -> None:
        assert self._version_event is not None
        while self._version < needed:
            self._version_event.clear()
            if self._version >= needed:
                return
            await self._version_event.wait()

    def _sampling_args(self, step: int, position: int, rollout: int) -> dict[str, Any]:
        seed = None
        if self.cfg.sampling.seed_requests:
            seed = request_seed(self.cfg.seed, step, position, rollout)
        return build_sampling_args(self.cfg.sampling, self.env.sampling_args, seed)

    async def _run_groups(
        self, rows: list[dict], step: int, first_position: int, group_size: int
    ) -> list[GroupResult]:
        limit = self.cfg.batch.max_concurrent
        semaphore = asyncio.Semaphore(limit if limit > 0 else len(rows) or 1)

        async def one(i: int, row: dict) -> GroupResult:
            args = [self._sampling_args(step, first_position + i, r) for r in range(group_size)]
            async with semaphore:
                return await run_group(
                    self.env,
                    self._client,
                    self.cfg.served_model,
                    row,
                    args,
                    self.cfg.batch.max_seq_len,
                    self.cfg.batch.mask_truncated,
                )

        return list(await asyncio.gather(*(one(i, row) for i, row in enumerate(rows))))

    def _next_rows(self, count: int) -> tuple[list[dict], int, int]:
        """The next `count` rows whose prompts fit, the first row's position, and how many
        rows were skipped for being too long."""
        rows: list[dict] = []
        first = self.position
        skipped = 0
        while len(rows) < count:
            (index,) = self.order.rows(self.position, 1)
            self.position += 1
            row = self.dataset[index]
            if self.prompt_fits(row):
                rows.append(row)
                continue
            skipped += 1
            if skipped > len(self.dataset):
                raise RuntimeError(
                    f"no prompt of the dataset fits batch.max_prompt_len="
                    f"{self.cfg.batch.max_prompt_len} tokens"
                )
        return rows, first, skipped

    async def generate_step(self, step: int) -> StepBatch:
        rows, first, skipped = self._next_rows(self.cfg.examples_per_step)
        version = self._version
        began = time.perf_counter()
        groups = await self._run_groups(rows, step, first, self.cfg.batch.rollouts_per_example)
        errors = [e for g in groups for e in g.errors]
        for message in errors[:3]:
            log.warning("step %d: rollout errored: %s", step, message)
        return StepBatch(
            step,
            groups,
            data_position=self.position,
            skipped_prompts=skipped,
            generate_s=time.perf_counter() - began,
            min_policy_version=version,
            errors=errors,
        )

    async def _evaluate(self, num_examples: int, rollouts_per_example: int) -> EvalResult:
        dataset = self.env.get_eval_dataset(n=num_examples)
        rows = [dataset[i] for i in range(len(dataset))]
        groups = await self._run_groups(rows, -1, 0, rollouts_per_example)
        rollouts = [r for g in groups for r in g.rollouts]
        metrics: dict[str, float] = {}
        for name in sorted({k for r in rollouts for k in r.metrics}):
            values = [r.metrics[name] for r in rollouts if name in r.metrics]
            metrics[name] = sum(values) / len(values)
        n = len(rollouts)
        return EvalResult(
            reward=sum(r.reward for r in rollouts) / n if n else 0.0,
            metrics=metrics,
            num_rollouts=n,
            errored=sum(g.errored for g in groups),
            truncated=sum(r.truncated for r in rollouts),
        )
