"""Wall time of a decomposed rollout's worker phase: concurrent subproblem calls (vf_planner) vs
sequential calls (the seed's FrozenWorker loop), for 2-4 subproblems, measured in one run.

The worker is a scripted OpenAI-compatible server on 127.0.0.1 with a modelled per-call latency
(time to first token + tokens / decode speed, slept with asyncio so it costs no CPU). It serves
concurrent calls without slowing each one down, as an idle batching server would; a loaded real
server slows each stream somewhat, so the measured ratio is an upper bound on the gain. Both modes
use the same vf_planner Worker (same prompts, client, semaphore); only the scheduling differs. The
direct-solve baseline is cached per problem and the planner call is the same in both modes, so
neither is part of the timed phase.

    .venv/bin/python bench/planner_worker.py [--repeats 3] [--data ../shared/data/gsm8k/test.jsonl]

Prints the median wall time of each mode for 2, 3 and 4 subproblems (with the latency model's
expected ratio) and saves them as JSON to bench/results/planner_worker.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from openai import AsyncOpenAI
from vf_planner.prompts import WORKER_COMBINE_SYSTEM
from vf_planner.scripted_server import ScriptedOpenAIServer, ScriptedReply
from vf_planner.worker import Worker, WorkerReply, WorkerSettings

from rlvr.eval.stats import percentile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TTFT_S = 0.05  # time to first token
DECODE_TOKENS_PER_S = 100.0  # single-stream decode of a ~8B model on one GPU
SUBPROBLEM_TOKENS, COMBINE_TOKENS = 60, 40
MODEL = "worker-base"


def call_latency(tokens: int) -> float:
    return TTFT_S + tokens / DECODE_TOKENS_PER_S


def scripted_worker(model: str, messages: list[dict]) -> ScriptedReply:
    """Every reply ends in a number; latency follows the modelled decode speed."""
    combine = messages[0]["content"] == WORKER_COMBINE_SYSTEM
    tokens = COMBINE_TOKENS if combine else SUBPROBLEM_TOKENS
    return ScriptedReply("Answer: 7", tokens, delay=call_latency(tokens))


async def concurrent_phase(worker: Worker, subproblems: list[str]) -> WorkerReply:
    replies = await worker.solve_subproblems(subproblems)
    return await worker.combine("combine", subproblems, replies)


async def sequential_phase(worker: Worker, subproblems: list[str]) -> WorkerReply:
    replies = [await worker.solve_subproblem(sub) for sub in subproblems]
    return await worker.combine("combine", subproblems, replies)


async def time_mode(phase, worker: Worker, questions: list[str], k: int) -> list[float]:
    times = []
    for question in questions:
        subproblems = [f"Part {i + 1} of: {question}" for i in range(k)]
        start = time.perf_counter()
        await phase(worker, subproblems)
        times.append(time.perf_counter() - start)
    return times


async def run(base_url: str, questions: list[str]) -> list[dict]:
    settings = WorkerSettings(model=MODEL, base_url=base_url, timeout=60.0)
    client = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    worker = Worker(client, MODEL, settings, asyncio.Semaphore(settings.max_concurrent))
    await worker.solve_subproblem("warm-up")  # connection setup outside the timing
    sub_s, combine_s = call_latency(SUBPROBLEM_TOKENS), call_latency(COMBINE_TOKENS)
    rows = []
    for k in (2, 3, 4):
        sequential = await time_mode(sequential_phase, worker, questions, k)
        concurrent = await time_mode(concurrent_phase, worker, questions, k)
        seq, con = percentile(sequential, 50), percentile(concurrent, 50)
        rows.append(
            {
                "subproblems": k,
                "sequential_s": seq,
                "concurrent_s": con,
                "speedup": seq / con,
                "model_sequential_s": k * sub_s + combine_s,
                "model_concurrent_s": sub_s + combine_s,
                "sequential_runs_s": sequential,
                "concurrent_runs_s": concurrent,
            }
        )
    await client.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="rollouts per mode and size")
    parser.add_argument(
        "--data", type=Path, default=ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"
    )
    args = parser.parse_args()
    with args.data.open() as f:
        questions = [
            json.loads(line)["question"] for _, line in zip(range(args.repeats), f, strict=False)
        ]

    print(
        "worker: scripted OpenAI-compatible server, modelled latency per call ="
        f" {TTFT_S * 1000:.0f} ms + tokens / {DECODE_TOKENS_PER_S:.0f} tok/s (subproblem"
        f" {SUBPROBLEM_TOKENS} tokens = {call_latency(SUBPROBLEM_TOKENS):.2f} s, combine"
        f" {COMBINE_TOKENS} tokens = {call_latency(COMBINE_TOKENS):.2f} s);"
        f" median of {args.repeats} rollouts"
    )
    with ScriptedOpenAIServer(scripted_worker, models=[{"id": MODEL}]) as server:
        rows = asyncio.run(run(server.base_url, questions))

    print(f"{'k':>2} {'sequential s':>13} {'concurrent s':>13} {'speedup':>8} {'model':>7}")
    for r in rows:
        model_ratio = r["model_sequential_s"] / r["model_concurrent_s"]
        print(
            f"{r['subproblems']:>2} {r['sequential_s']:>13.3f} {r['concurrent_s']:>13.3f}"
            f" {r['speedup']:>7.2f}x {model_ratio:>6.2f}x"
        )
    payload = {
        "what": "wall time of a decomposed rollout's worker phase (subproblems + combine)",
        "baseline": "sequential subproblem calls (seed FrozenWorker loop)",
        "latency_model": {
            "ttft_s": TTFT_S,
            "decode_tokens_per_s": DECODE_TOKENS_PER_S,
            "subproblem_tokens": SUBPROBLEM_TOKENS,
            "combine_tokens": COMBINE_TOKENS,
            "note": "scripted server; concurrent calls do not slow each other (idle server)",
        },
        "repeats": args.repeats,
        "results": rows,
    }
    save("planner_worker", payload)


if __name__ == "__main__":
    main()
