"""The answer check (math-verify on the forms of ``forms.py``) and the worker process that runs it.

This file and ``forms.py`` use the standard library and math-verify only, because the pool runs
this one as a script, ``python -P verifier.py``, which loads ``forms.py`` by its path: importing
``vf_deepscaler.verifier`` would first run the package ``__init__`` (verifiers, datasets), which
costs each worker seconds of start-up and ~150 MB.

A worker answers one request at a time, one JSON line on stdin and one on stdout. It stops
itself first when it can: each check runs under a wall-clock alarm (``ITIMER_REAL``; free to
use because the worker turns math-verify's own ``SIGALRM`` timeouts off) and reports
``timeout`` instead of dying. The parent's kill is the backstop for work no signal can
interrupt, such as a long multiplication of huge integers inside C code.

Protocol: the worker first writes ``{"ready": true}`` (or ``{"fatal": traceback}``); then for
each request ``{"gold", "prediction", "soft_s", "percent"}`` (``percent``: the problem asks for
a percent, optional) it writes ``{"correct": bool, "status": ...}``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import signal
import sys
import traceback
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from math_verify import parse, verify


def _sibling(name: str) -> ModuleType:
    """The module ``name.py`` beside this file, loaded by path (the worker has no package)."""
    spec = importlib.util.spec_from_file_location(
        f"_vf_deepscaler_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __package__:
    from .forms import readings
else:  # the worker script
    readings = _sibling("forms").readings

MAX_ANSWER_CHARS = 2_000
"""Longer boxed answers score 0 without being parsed (the longest gold in DeepScaleR is ~40)."""
MEMORY_LIMIT_BYTES = 4 << 30
"""Address-space cap: a runaway expression fails with MemoryError instead of swapping the host."""


@lru_cache(maxsize=8_192)
def _parse_gold(gold: str, timeout: int | None) -> tuple:
    """Gold answers repeat across the rollouts of a group, so each is parsed once per process."""
    return tuple(parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout))


def is_equivalent(
    gold: str, prediction: str, timeout: int | None = None, percent: bool = False
) -> bool:
    """True when the boxed ``prediction`` equals ``gold`` (numbers, fractions, sets, intervals,
    LaTeX, units, percents: the readings of ``forms.py``; ``percent`` when the problem asks for
    a percent); False for empty or over-long predictions.

    ``timeout=None`` turns off math-verify's own signal timeouts: the worker bounds the whole
    check instead. The benchmark's inline baseline passes math-verify's default of 5 seconds.
    """
    prediction = prediction.strip()
    if not prediction or not gold.strip() or len(prediction) > MAX_ANSWER_CHARS:
        return False
    return any(
        verify(
            list(_parse_gold(gold_form, timeout)),
            parse(f"\\boxed{{{form}}}", parsing_timeout=timeout),
            timeout_seconds=timeout,
        )
        for gold_form, form in readings(gold, prediction, percent)
    )


class SoftTimeout(BaseException):
    """Raised by the alarm; a BaseException so that math-verify cannot swallow it."""


def _raise_soft_timeout(signum: int, frame: Any) -> None:
    raise SoftTimeout


def check(request: dict[str, Any]) -> dict[str, Any]:
    """Run one check under the alarm; any failure scores 0 with its reason."""
    try:
        signal.setitimer(signal.ITIMER_REAL, float(request["soft_s"]))
        try:
            correct = is_equivalent(
                str(request["gold"]),
                str(request["prediction"]),
                percent=bool(request.get("percent", False)),
            )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except SoftTimeout:
        return {"correct": False, "status": "timeout"}
    except Exception as exc:  # a crash in sympy is a wrong answer, not a dead worker
        detail = f"{type(exc).__name__}: {exc}"[:300]
        return {"correct": False, "status": "error", "detail": detail}
    return {"correct": correct, "status": "ok"}


def _isolate_process() -> TextIO:
    """Die with the parent, cap memory, ignore Ctrl-C (the parent's business), and keep a
    private handle on stdout for replies: fd 1 then points at stderr, so stray prints from
    sympy or other libraries cannot corrupt the protocol. Best effort outside Linux."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, ValueError, AttributeError, ImportError):
        pass
    return replies


def _send(replies: TextIO, message: dict[str, Any]) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def serve() -> None:
    """Warm up (imports, sympy's lazy parsers), say ready, then answer until stdin closes."""
    replies = _isolate_process()
    signal.signal(signal.SIGALRM, _raise_soft_timeout)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    try:
        is_equivalent("\\frac{1}{2}", "0.5")  # loads sympy's lazy parts before the clock runs
    except Exception:  # reported to the parent, which raises it
        _send(replies, {"fatal": traceback.format_exc()})
        return
    _send(replies, {"ready": True})
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            _send(replies, {"correct": False, "status": "error", "detail": f"bad request: {exc}"})
            continue
        _send(replies, check(request))


if __name__ == "__main__":
    serve()
