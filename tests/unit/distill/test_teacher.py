"""The teacher's client on its own: what it reads from a scoring answer, and how an
unreachable teacher is told (the scoring runs against real servers in
tests/integration/test_distill.py)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from rlvr.batch import Sample
from rlvr.config import ConfigError, DistillConfig
from rlvr.distill.teacher import Teacher, TeacherError, read_prompt_logprobs, token_logprob


def answer(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


def test_a_scoring_answer_is_read_or_refused():
    entries = [None, {"5": {"logprob": -1.5, "rank": 3}}, {"9": {"logprob": -0.25}, "2": {}}]
    body = {"choices": [{"prompt_logprobs": entries}]}
    assert read_prompt_logprobs(answer(200, body), 3) == entries
    assert token_logprob(entries, 1, 5) == -1.5 and token_logprob(entries, 2, 9) == -0.25
    with pytest.raises(TeacherError, match="HTTP 400"):
        read_prompt_logprobs(answer(400, {"error": "too long"}), 3)
    with pytest.raises(TeacherError, match="no prompt_logprobs"):
        read_prompt_logprobs(answer(200, {"choices": []}), 3)
    with pytest.raises(TeacherError, match="for 4 ids expected"):
        read_prompt_logprobs(answer(200, body), 4)
    with pytest.raises(TeacherError, match="no score of token 6 at position 1"):
        token_logprob(entries, 1, 6)
    with pytest.raises(TeacherError, match="no score of token 1 at position 0"):
        token_logprob(entries, 0, 1)


def closed_port() -> int:
    """A local port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_teacher_fails_its_tries_by_name():
    """A teacher nothing answers at: the start-up check is a ConfigError naming the URL, and
    a scoring request fails after its tries with a TeacherError naming each."""
    url = f"http://127.0.0.1:{closed_port()}/v1"
    cfg = DistillConfig(base_url=url, timeout_s=5)
    with pytest.raises(ConfigError, match=f"the teacher at {url} does not answer"):
        Teacher.checked(cfg, tokenizer=None, longest=64)
    teacher = Teacher(cfg, "teacher-model")
    sample = Sample([1, 2, 3], [0, 1, 1], [0.0, -1.0, -2.0])
    with pytest.raises(TeacherError) as told:
        asyncio.run(teacher.score(sample))
    message = str(told.value)
    assert "distill.model='teacher-model'" in message and "none of 2 tries" in message
    assert message.count(f"{url}: ConnectError") == 2
    unscored = Sample([1, 2], [0, 0], [0.0, 0.0])  # nothing sampled: nothing to ask
    assert asyncio.run(teacher.score(unscored)).teacher_logprobs == [0.0, 0.0]
