"""Run `vf-eval` on an environment and read back the rollouts it saved: the one place that builds
its command line, runs it and parses its results, so tests, the demo and evaluation reports
evaluate the way users do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.finite import finite_number
from rlvr.jsonl import iter_jsonl

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
    """(line number, rollout) for every non-blank line of a results.jsonl; a line that is not
    a JSON object raises ResultsError, a cut-off last line included (verifiers skips it
    silently; a report over an interrupted run must say so)."""
    for number, row in iter_jsonl(path, ResultsError):
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
    `sampling_args` go as vf-eval's `-S`; `num_examples` / `rollouts_per_example` of None
    take the environment's defaults. Raises RuntimeError (with vf-eval's output tails) on a
    failed run or no results, ResultsError on a malformed line, TimeoutExpired after `timeout`.
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


def evaluate_policy(
    cfg: Any,
    base_url: str,
    out: Path,
    *,
    env_args: dict[str, Any],
    examples: int,
    rollouts: int,
) -> list[dict[str, Any]]:
    """vf-eval of the policy a GRPO run serves (`cfg.served_model` at `base_url`) with the run
    config's environment (`cfg.env`, its args updated by `env_args`, e.g. held-out data) and
    sampling (temperature, max_tokens), into a fresh `out`: a new evaluation must not read an
    earlier one's results there. The before/after evaluations of `make demo` and of the
    bench/learning*.py benchmarks; raises as `run_vf_eval`."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    return run_vf_eval(
        cfg.env.id,
        model=cfg.served_model,
        base_url=base_url,
        output_dir=out,
        num_examples=examples,
        rollouts_per_example=rollouts,
        max_tokens=cfg.sampling.max_tokens,
        env_args={**cfg.env.args, **env_args},
        sampling_args={"temperature": cfg.sampling.temperature},
        timeout=None,
    )


# ---- a saved run ----------------------------------------------------------------------------


def errored(row: dict[str, Any]) -> bool:
    """vf-eval saves `error` with every rollout: None when it ran cleanly, the error's type and
    chain when the model call, a tool or the environment raised."""
    return row.get("error") is not None


@dataclass(frozen=True)
class Rollout:
    """One saved rollout: where it was saved, the fields every number needs (checked), and the
    row as vf-eval saved it."""

    line: int
    example_id: int
    reward: float
    row: dict[str, Any]


@dataclass(frozen=True)
class Run:
    """The rollouts and metadata of one vf-eval run, under the name the report gives it."""

    name: str
    results: Path
    metadata: dict[str, Any]
    rollouts: list[Rollout]

    def by_example(self) -> dict[int, list[Rollout]]:
        """Rollouts grouped by example id, in the order of first appearance."""
        groups: dict[int, list[Rollout]] = defaultdict(list)
        for rollout in self.rollouts:
            groups[rollout.example_id].append(rollout)
        return dict(groups)


def load_run(run_dir: str | Path, name: str) -> Run:
    """Read the one vf-eval run saved below `run_dir`; ResultsError when there is none, more
    than one, a malformed line, or a rollout without a numeric reward or integer example id."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir}: no such directory")
    found = find_results(run_dir)
    if not found:
        raise ResultsError(f"{run_dir}: no results.jsonl below it (vf-eval saves one with -s)")
    if len(found) > 1:
        listing = "".join(f"\n  {path.parent}" for path in found)
        raise ResultsError(f"{run_dir} holds {len(found)} vf-eval runs; pass one of:{listing}")
    results = found[0]
    rollouts = [_rollout(results, line, row) for line, row in iter_results(results)]
    if not rollouts:
        raise ResultsError(f"{results}: no rollouts")
    return Run(name, results, _metadata(results.parent / "metadata.json"), rollouts)


def _rollout(path: Path, line: int, row: dict[str, Any]) -> Rollout:
    if "reward" not in row:
        raise ResultsError(f"{path}:{line}: no 'reward' field")
    reward = finite_number(row["reward"])
    if reward is None:
        raise ResultsError(f"{path}:{line}: reward {row['reward']!r} is not a finite number")
    example_id = row.get("example_id")
    if isinstance(example_id, bool) or not isinstance(example_id, int):
        raise ResultsError(f"{path}:{line}: example_id {example_id!r} is not an integer")
    return Rollout(line, example_id, reward, row)


def _metadata(path: Path) -> dict[str, Any]:
    """vf-eval's metadata.json beside the results; {} when absent (the rows alone still report,
    without environment, model and sampling)."""
    if not path.is_file():
        return {}
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON ({e.msg})") from None
    if not isinstance(metadata, dict):
        raise ResultsError(f"{path}: metadata must be a JSON object")
    return metadata
