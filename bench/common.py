"""Shared bits of the benchmarks: summary statistics (percentiles from rlvr.eval.stats), saving
results as JSON beside the printout (every benchmark writes the same envelope: benchmark, date,
machine), and the stages of the "does it learn?" benchmarks (bench/learning*.py): a vf-eval run
of a served policy and a training script run as a user runs it."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.eval.stats import Estimate, percentile

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def summary(values: Sequence[float], *, ms: bool = False) -> dict[str, float]:
    """n, mean, p50, p99, min and max of `values` (NaN when there are none). With `ms`, the
    values are seconds and the statistics come out in milliseconds, keys ending in `_ms`."""
    scaled = [v * 1e3 for v in values] if ms else list(values)
    nan = float("nan")
    stats = {
        "mean": statistics.fmean(scaled) if scaled else nan,
        "p50": percentile(scaled, 50),
        "p99": percentile(scaled, 99),
        "min": min(scaled, default=nan),
        "max": max(scaled, default=nan),
    }
    suffix = "_ms" if ms else ""
    return {"n": len(scaled), **{key + suffix: value for key, value in stats.items()}}


def result_path(name: str) -> Path:
    """Where `save(name, ...)` writes by default: bench/results/<name>.json."""
    return RESULTS / f"{name}.json"


def machine() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def save(name: str, payload: dict, path: str | Path | None = None) -> Path:
    """Write `payload` with the benchmark's name, the date and the machine it ran on to `path`
    (default bench/results/<name>.json), atomically: a reader never sees half a file."""
    path = Path(path) if path is not None else result_path(name)
    envelope = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
    }
    clash = envelope.keys() & payload.keys()
    if clash:
        raise ValueError(f"payload keys {sorted(clash)} would overwrite the envelope's")
    atomic_write_text(path, json.dumps({**envelope, **payload}, indent=2) + "\n")
    print(f"saved {path}")
    return path


# ---- stages of the learning benchmarks ------------------------------------------------------


def evaluate_stage(
    cfg: Any, base_url: str, out: Path, *, env_args: dict[str, Any], examples: int, rollouts: int
) -> list[dict[str, Any]]:
    """`rlvr.eval.vf_eval.evaluate_policy` (the run config's served policy, environment and
    sampling, into a fresh `out`), timed; prints and returns the rollouts."""
    from rlvr.eval.vf_eval import evaluate_policy

    began = time.perf_counter()
    rows = evaluate_policy(
        cfg, base_url, out, env_args=env_args, examples=examples, rollouts=rollouts
    )
    reward = sum(r["reward"] for r in rows) / len(rows)
    print(
        f"  {out.name}: {len(rows)} rollouts, mean reward {reward:.3f} "
        f"({time.perf_counter() - began:.0f} s)",
        flush=True,
    )
    return rows


def run_script(script: str, config: Path, out: Path, overrides: Sequence[str]) -> float:
    """`python scripts/<script> --config <config> output_dir=<out> <overrides>` into a fresh
    `out` (never a resumed run), as a user runs it; returns the wall time."""
    shutil.rmtree(out, ignore_errors=True)
    began = time.perf_counter()
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / script),
        "--config",
        str(config),
        f"output_dir={out}",
        *overrides,
    ]
    subprocess.run(cmd, check=True)
    return time.perf_counter() - began


def estimate_json(estimate: Estimate) -> dict[str, Any]:
    return {"mean": estimate.mean, "low": estimate.low, "high": estimate.high, "n": estimate.n}
