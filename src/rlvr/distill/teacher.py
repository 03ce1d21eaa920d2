"""The teacher of on-policy distillation: a vLLM server that scores exactly the token ids the
student sampled (prompt log-probabilities of each sample, one request per sample), and the
start-up checks that make its scores comparable with the sampler's.

Groups are graded as each finishes generating, on the rollout worker's loop, so scoring runs
beside the rest of the step's generation (and, with `batch.async_level` >= 1, beside training).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import replace
from typing import Any

import httpx

from rlvr.batch import GroupResult, RolloutResult, Sample
from rlvr.config import ConfigError
from rlvr.config.distill import DistillConfig
from rlvr.config.server import auth_header, server_root

PROBE_TEXT = (
    "The teacher and the student must read text alike: 12 + 30 = 42, déjà vu, 東京, "
    "<think> `code()` </think>\n\tIndented line; über-long-hyphenated-words!"
)
"""Text both tokenizers encode at start (`check_tokenizer`): digits, accents, CJK, markup and
whitespace, where tokenizers of different families part ways first."""

TRIES = 2
"""Tries of a scoring request (on the next teacher server each time) before the run stops."""


class TeacherError(RuntimeError):
    """The teacher answered none of a scoring request's tries (gone, refusing, or answering
    something that is not scores): the run stops, naming each server and why."""


class Teacher:
    """Scores samples on the teacher's servers; `checked` builds one after the start-up checks.

    `seconds` sums every scoring request's time (the step's `distill/teacher_seconds` is its
    growth). The HTTP client is made on first use, on the loop that scores (the rollout
    worker's); `aclose` closes it there."""

    def __init__(self, cfg: DistillConfig, model: str):
        self.cfg = cfg
        self.model = model
        self.seconds = 0.0
        self._next = itertools.cycle(range(len(cfg.urls)))
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    @classmethod
    def checked(cls, cfg: DistillConfig, tokenizer: Any, longest: int) -> Teacher:
        """The teacher of `cfg`, once every server of it serves its model, takes sequences of
        `longest` tokens and tokenizes like the student's `tokenizer`; else ConfigError."""
        model = cfg.model
        with httpx.Client(headers=auth_header(cfg.api_key), timeout=cfg.timeout_s) as client:
            for url in cfg.urls:
                model = check_served(client, url, model, longest)
                check_tokenizer(client, url, model, tokenizer)
        return cls(cfg, model)

    async def grade(self, group: GroupResult) -> GroupResult:
        """`group` with the teacher's log-probabilities on every sample of every rollout."""
        rollouts = await asyncio.gather(*(self._grade_rollout(r) for r in group.rollouts))
        return replace(group, rollouts=list(rollouts))

    async def _grade_rollout(self, rollout: RolloutResult) -> RolloutResult:
        samples = await asyncio.gather(*(self.score(s) for s in rollout.samples))
        return replace(rollout, samples=list(samples))

    async def score(self, sample: Sample) -> Sample:
        """`sample` with `teacher_logprobs`: the teacher's log-probability of each loss token
        given every id before it, exactly as the sampler saw them (0.0 on other tokens)."""
        if not sample.num_loss_tokens:
            return replace(sample, teacher_logprobs=[0.0] * len(sample))
        entries = await self._prompt_logprobs(sample.input_ids)
        scores = []
        for i, (token, mask) in enumerate(zip(sample.input_ids, sample.loss_mask, strict=True)):
            scores.append(token_logprob(entries, i, token) if mask else 0.0)
        return replace(sample, teacher_logprobs=scores)

    async def _prompt_logprobs(self, ids: list[int]) -> list[Any]:
        """The teacher's `prompt_logprobs` of `ids`, tried on the next server up to TRIES
        times; TeacherError naming every failure."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                headers=auth_header(self.cfg.api_key), timeout=self.cfg.timeout_s
            )
            self._slots = asyncio.Semaphore(self.cfg.max_concurrent)
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        }
        failures: list[str] = []
        for _ in range(max(TRIES, len(self.cfg.urls))):
            url = self.cfg.urls[next(self._next)]
            async with self._slots:
                began = time.perf_counter()
                try:
                    route = f"{server_root(url)}/v1/completions"
                    answer = await self._client.post(route, json=body)
                    entries = read_prompt_logprobs(answer, len(ids))
                except (httpx.HTTPError, TeacherError) as e:
                    failures.append(f"{url}: {type(e).__name__}: {e}")
                    continue
                finally:
                    self.seconds += time.perf_counter() - began
            return entries
        raise TeacherError(
            f"the teacher (distill.model={self.model!r}) scored none of {len(failures)} tries "
            f"of a {len(ids)}-token sample; is its server up? " + "; ".join(failures)
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def read_prompt_logprobs(answer: httpx.Response, length: int) -> list[Any]:
    """The `prompt_logprobs` list of a completions answer (one entry per prompt id); TeacherError
    for an error status or an answer without them."""
    if answer.status_code >= 400:
        raise TeacherError(f"HTTP {answer.status_code}: {answer.text[:300]}")
    try:
        entries = answer.json()["choices"][0]["prompt_logprobs"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise TeacherError(f"no prompt_logprobs in the answer: {answer.text[:300]}") from None
    if not isinstance(entries, list) or len(entries) != length:
        raise TeacherError(f"prompt_logprobs for {length} ids expected, got {answer.text[:300]}")
    return entries


def token_logprob(entries: list[Any], position: int, token: int) -> float:
    """The teacher's log-probability of `token` at `position` from its `prompt_logprobs`."""
    try:
        value = float(entries[position][str(token)]["logprob"])
    except (KeyError, TypeError, ValueError):
        raise TeacherError(
            f"the teacher's prompt_logprobs hold no score of token {token} at position "
            f"{position}: {str(entries[position])[:200]}"
        ) from None
    if not math.isfinite(value):
        raise TeacherError(f"the teacher scored token {token} at position {position} {value}")
    return value


def check_served(client: httpx.Client, url: str, model: str | None, longest: int) -> str:
    """The teacher's model name at `url` (`model`, or the first the server lists), once the
    server lists it and its context holds `longest` tokens and the one it must generate."""
    try:
        listed = client.get(f"{server_root(url)}/v1/models").raise_for_status().json()["data"]
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise ConfigError(f"distill: the teacher at {url} does not answer: {e}") from None
    by_id = {entry["id"]: entry for entry in listed}
    name = model or (listed[0]["id"] if listed else "")
    if name not in by_id:
        raise ConfigError(
            f"distill.model={name!r} is not served at {url} (it serves {sorted(by_id)})"
        )
    entry = by_id[name]
    room = entry.get("max_model_len") or by_id.get(entry.get("parent"), {}).get("max_model_len")
    if room is not None and room < longest + 1:
        raise ConfigError(
            f"distill: the teacher {name!r} at {url} holds {room} tokens (max_model_len), but "
            f"a sample may take batch.max_seq_len={longest} and scoring generates one more: "
            "serve the teacher with a longer --max-model-len or lower batch.max_seq_len"
        )
    return name


def check_tokenizer(client: httpx.Client, url: str, model: str, tokenizer: Any) -> None:
    """ConfigError unless the teacher at `url` encodes PROBE_TEXT to the student's ids: the
    teacher scores the student's ids, which mean other text to another tokenizer."""
    body = {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False}
    try:
        answer = client.post(f"{server_root(url)}/tokenize", json=body).raise_for_status()
        theirs = list(answer.json()["tokens"])
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise ConfigError(f"distill: the teacher at {url} does not tokenize: {e}") from None
    ours = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))
    if theirs != ours:
        at = next(i for i, (a, b) in enumerate(itertools.zip_longest(theirs, ours)) if a != b)
        student = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
        raise ConfigError(
            f"distill: the teacher {model!r} at {url} tokenizes other than the student "
            f"({student}): on the probe text their ids part at token {at} (teacher "
            f"{theirs[at : at + 4]}, student {ours[at : at + 4]}); the teacher scores the "
            "student's token ids, so both must share one tokenizer"
        )
