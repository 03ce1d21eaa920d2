"""Run `vf-eval` on an environment and read back the rollouts it saved.

Integration tests and the demo evaluate environments the way users do, with the installed
`vf-eval` command against a served model, rather than by calling verifiers' internals; this is the
one place that builds that command line, runs it and parses its results (which evaluation
reports read too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The vf-eval installed with this interpreter (the project's venv), not whichever is on PATH.
VF_EVAL = Path(sys.executable).parent / "vf-eval"
# vf-eval reads the API key from a named variable; vf-vllm ignores it, so any value will do.
API_KEY_VAR = "RLVR_EVAL_API_KEY"
TAIL_CHARS = 3000


class ResultsError(ValueError):
    """Saved vf-eval results that are missing, malformed or cannot be compared."""


def find_results(output_dir: Path) -> list[Path]:
    """Every results.jsonl below `output_dir`, sorted. vf-eval nests them as
    `evals/<env>--<model>/<run id>/results.jsonl` under its `-o` directory."""
    return sorted(Path(output_dir).rglob("results.jsonl"))


def iter_results(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, rollout) for every non-blank line of a results.jsonl.

    A line that is not a JSON object raises ResultsError naming the file and line, a cut-off last
    line included: verifiers skips that one silently, but a report over an interrupted run must
    say so rather than quietly count fewer rollouts.
    """
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ResultsError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ResultsError(f"{path}:{number}: a rollout must be a JSON object")
            yield number, row


def _failure(message: str, proc: subprocess.CompletedProcess[str]) -> RuntimeError:
    """An error carrying the ends of vf-eval's output, where its own error message is."""
    return RuntimeError(
        f"{message}\n--- vf-eval stdout (tail) ---\n{proc.stdout[-TAIL_CHARS:]}"
        f"\n--- vf-eval stderr (tail) ---\n{proc.stderr[-TAIL_CHARS:]}"
    )


def run_vf_eval(
    env_id: str,
    *,
    model: str,
    base_url: str,
    output_dir: Path,
    num_examples: int | None,
    rollouts_per_example: int | None = 1,
    max_tokens: int | None = None,
    env_args: dict[str, Any] | None = None,
    state_columns: list[str] | None = None,
    sampling_args: dict[str, Any] | None = None,
    timeout: float | None = 900,
) -> list[dict[str, Any]]:
    """Evaluate `env_id` on `model` served at `base_url`, saving results under `output_dir`
    (`-s`, plain logging with `-d`), and return the saved rollouts (one dict per row of every
    results.jsonl found there). `state_columns` are extra state fields saved with each rollout;
    `sampling_args` go to the model as vf-eval's `-S` (e.g. a seed, or vLLM's `extra_body`).
    `num_examples` / `rollouts_per_example` of None leave out `-n` / `-r`, so vf-eval takes the
    environment's own defaults (its `[tool.verifiers.eval]` table).

    Raises RuntimeError, with the tails of vf-eval's stdout and stderr, if vf-eval exits non-zero
    or saves no results; ResultsError if a saved line is malformed; subprocess.TimeoutExpired
    after `timeout` seconds (None: no limit).
    """
    cmd = [str(VF_EVAL), env_id, "-m", model, "-b", base_url, "-k", API_KEY_VAR]
    if num_examples is not None:
        cmd += ["-n", str(num_examples)]
    if rollouts_per_example is not None:
        cmd += ["-r", str(rollouts_per_example)]
    cmd += ["-s", "-d", "-o", str(output_dir)]
    if max_tokens is not None:
        cmd += ["-t", str(max_tokens)]
    if env_args is not None:
        cmd += ["-a", json.dumps(env_args)]
    if state_columns:
        cmd += ["-C", ",".join(state_columns)]
    if sampling_args:
        cmd += ["-S", json.dumps(sampling_args)]
    env = {**os.environ, API_KEY_VAR: "EMPTY"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise _failure(f"vf-eval {env_id} failed with exit code {proc.returncode}", proc)
    results = find_results(output_dir)
    if not results:
        raise _failure(f"vf-eval {env_id} saved no results under {output_dir}", proc)
    return [row for path in results for _, row in iter_results(path)]
