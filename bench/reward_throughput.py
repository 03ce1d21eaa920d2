"""Reward throughput of vf_deepscaler: the protected verifier (worker processes with a hard time
limit) against calling math-verify inline in the reward function, on the 803 DeepScaleR rows.

Each row gives two rollouts (its gold answer boxed, and a wrong value boxed). Rollouts are scored
the way verifiers scores a batch: concurrently on one event loop, ``--concurrency`` at a time
(default: one per worker, so that latency is the check itself rather than queueing). The
adversarial workload adds a few pathological answers (``9^{9^{9^9}}``, factorial towers) that
make sympy compute far past the limit. For each mode the table shows rollouts scored per
second, per-rollout latency (p50/p99, from the start of its scoring), the longest event-loop
stall (a ticker every 10 ms), and accuracy against the expected scores. Ratios are
protected / inline, measured in the same run.

    .venv/bin/python bench/reward_throughput.py            # ~1-2 minutes on 2 cores
    .venv/bin/python bench/reward_throughput.py [--rows PATH] [--workers N]
        [--verify-timeout-s 5] [--concurrency N] [--out PATH]

Prints the table and saves it as JSON to --out (default bench/results/reward_throughput.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from vf_deepscaler import load_environment
from vf_deepscaler.parser import BoxedAnswerParser
from vf_deepscaler.rubric import DeepScaleRRubric
from vf_deepscaler.verifier import is_equivalent

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_path, save, summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ROWS = ROOT.parent / "shared" / "data" / "deepscaler" / "preview_first803.jsonl"
PATHOLOGICAL = ["9^{9^{9^{9}}}", "(((10!)!)!)", "10^{10^{10^{10}}}", "((2^{100})!)!"]
MATH_VERIFY_DEFAULT_TIMEOUT_S = 5

Rollout = tuple[str, str, float]
"""(completion text, gold answer, expected reward)"""
Scorer = Callable[[str, str], Awaitable[float]]


def build_rollouts(rows: list[dict], adversarial: bool) -> list[Rollout]:
    """Two rollouts per row (right and wrong), plus the pathological answers when asked."""
    rollouts: list[Rollout] = []
    for row in rows:
        gold = row["answer"]
        wrong = str(int(gold) + 1) if re.fullmatch(r"-?\d+", gold.strip()) else "\\sqrt{1234567}"
        rollouts.append((f"Some work.\nThe answer is $\\boxed{{{gold}}}$.", gold, 1.0))
        rollouts.append((f"Some work.\nThe answer is $\\boxed{{{wrong}}}$.", gold, 0.0))
    if adversarial:
        step = len(rollouts) // (len(PATHOLOGICAL) + 1)
        for k, expression in enumerate(PATHOLOGICAL, start=1):
            rollouts.insert(k * step, (f"Hence $\\boxed{{{expression}}}$.", "1", 0.0))
    return rollouts


async def score_all(rollouts: list[Rollout], score: Scorer, concurrency: int) -> dict:
    """Score every rollout on this event loop; measure throughput, latency and loop stalls."""
    limit = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.01)

    async def one(text: str, gold: str) -> float:
        async with limit:
            await asyncio.sleep(0)  # as in a real run, other work gets the loop between rollouts
            started = time.perf_counter()
            reward = await score(text, gold)
            latencies.append(time.perf_counter() - started)
            return reward

    tick_task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = time.perf_counter()
    rewards = await asyncio.gather(*(one(text, gold) for text, gold, _ in rollouts))
    wall = time.perf_counter() - started
    done.set()
    await tick_task
    ticks.append(time.perf_counter())
    latency = summary(latencies, ms=True)
    return {
        "rollouts": len(rollouts),
        "wall_s": wall,
        "rollouts_per_s": len(rollouts) / wall,
        "p50_ms": latency["p50_ms"],
        "p99_ms": latency["p99_ms"],
        "max_ms": latency["max_ms"],
        "max_loop_stall_ms": 1e3 * max(b - a for a, b in zip(ticks, ticks[1:], strict=False)),
        "accuracy": sum(r == e for r, (_, _, e) in zip(rewards, rollouts, strict=True))
        / len(rollouts),
    }


def inline_scorer() -> Scorer:
    """The unprotected baseline: math-verify called directly in an async reward function, with
    its own signal timeouts (its defaults), blocking the event loop while it runs."""
    parser = BoxedAnswerParser()

    async def score(text: str, gold: str) -> float:
        prediction = parser.parse(text)
        return float(
            bool(prediction) and is_equivalent(gold, prediction, MATH_VERIFY_DEFAULT_TIMEOUT_S)
        )

    return score


def protected_scorer(rubric: DeepScaleRRubric) -> Scorer:
    async def score(text: str, gold: str) -> float:
        return await rubric.score_reply([{"role": "assistant", "content": text}], gold)

    return score


async def run(args: argparse.Namespace) -> dict:
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    env = load_environment(
        data_files=str(args.rows),
        max_examples=1,
        verify_timeout_s=args.verify_timeout_s,
        verify_workers=args.workers,
    )
    rubric = next(r for r in env.rubric.rubrics if isinstance(r, DeepScaleRRubric))
    started = time.perf_counter()
    await asyncio.gather(*(rubric.pool.check("1", "1") for _ in range(args.workers)))
    startup_s = time.perf_counter() - started
    is_equivalent("1", "1", MATH_VERIFY_DEFAULT_TIMEOUT_S)  # imports for the inline baseline

    results: dict[str, dict] = {}
    try:
        for workload in ("clean", "adversarial"):
            rollouts = build_rollouts(rows, adversarial=workload == "adversarial")
            for mode, scorer in (
                ("inline", inline_scorer()),
                ("protected", protected_scorer(rubric)),
            ):
                print(f"scoring {len(rollouts)} rollouts: {workload} / {mode} ...", flush=True)
                results[f"{workload}/{mode}"] = await score_all(rollouts, scorer, args.concurrency)
    finally:
        rubric.pool.close()
    ratios = {
        workload: {
            "throughput": results[f"{workload}/protected"]["rollouts_per_s"]
            / results[f"{workload}/inline"]["rollouts_per_s"],
            "p50": results[f"{workload}/protected"]["p50_ms"]
            / results[f"{workload}/inline"]["p50_ms"],
            "p99": results[f"{workload}/protected"]["p99_ms"]
            / results[f"{workload}/inline"]["p99_ms"],
        }
        for workload in ("clean", "adversarial")
    }
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {
            "rows": str(args.rows),
            "workers": args.workers,
            "verify_timeout_s": args.verify_timeout_s,
            "concurrency": args.concurrency,
            "inline_math_verify_timeout_s": MATH_VERIFY_DEFAULT_TIMEOUT_S,
        },
        "worker_startup_s": startup_s,
        "results": results,
        "ratios_protected_over_inline": ratios,
    }


def print_table(report: dict) -> None:
    header = (
        f"{'workload/mode':<22}{'rollouts':>9}{'wall s':>8}{'per s':>9}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'max ms':>9}{'loop stall ms':>15}{'accuracy':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, r in report["results"].items():
        print(
            f"{name:<22}{r['rollouts']:>9}{r['wall_s']:>8.2f}{r['rollouts_per_s']:>9.1f}"
            f"{r['p50_ms']:>9.2f}{r['p99_ms']:>9.1f}{r['max_ms']:>9.0f}"
            f"{r['max_loop_stall_ms']:>15.0f}{r['accuracy']:>10.4f}"
        )
    for workload, ratio in report["ratios_protected_over_inline"].items():
        print(
            f"protected / inline ({workload}): throughput x{ratio['throughput']:.2f}, "
            f"p50 x{ratio['p50']:.2f}, p99 x{ratio['p99']:.2f}"
        )
    print(f"worker start-up (once, not timed above): {report['worker_startup_s']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=Path, default=DEFAULT_ROWS)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--verify-timeout-s", type=float, default=5.0)
    parser.add_argument(
        "--concurrency", type=int, help="rollouts scored at once (default: workers)"
    )
    parser.add_argument("--out", type=Path, default=result_path("reward_throughput"))
    args = parser.parse_args()
    args.concurrency = args.concurrency or args.workers
    report = asyncio.run(run(args))
    print_table(report)
    save("reward_throughput", report, args.out)


if __name__ == "__main__":
    main()
