"""Shared bits of the benchmarks: percentiles and saving results as JSON beside the printout."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "min": min(values),
    }


def save(name: str, payload: dict) -> Path:
    """Write bench/results/<name>.json with the machine it ran on."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2))
    print(f"saved {path}")
    return path
