"""Raw vLLM generation throughput (tokens/s) at fixed concurrency: the baseline the training
pipeline is compared against (bench/train_step.py reports efficiency = its tokens/s / these).

Every request asks for exactly `--max-tokens` tokens (`ignore_eos`), so the server is kept at
the stated concurrency for the whole measurement. Run:

    .venv/bin/python bench/serve_throughput.py                    # starts vf-vllm on smollm2-135m
    .venv/bin/python bench/serve_throughput.py --base-url http://127.0.0.1:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

SERVER_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
DEFAULT_PROMPT = "Solve step by step and put the final answer in \\boxed{}: what is 17 * 23 + 4?"


async def measure(
    base_url: str,
    model: str,
    concurrency: int,
    num_requests: int,
    max_tokens: int,
    prompts: list[str] | None = None,
) -> dict[str, float]:
    """Send `num_requests` chat requests, `concurrency` at a time; return tokens/s and latency."""
    import httpx

    prompts = prompts or [DEFAULT_PROMPT]
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    tokens = 0
    limits = httpx.Limits(max_connections=concurrency, keepalive_expiry=3.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600, limits=limits) as http:

        async def one(i: int) -> None:
            nonlocal tokens
            body = {
                "model": model,
                "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "ignore_eos": True,
            }
            async with semaphore:
                began = time.perf_counter()
                response = await http.post("/chat/completions", json=body)
                response.raise_for_status()
                latencies.append(time.perf_counter() - began)
                tokens += response.json()["usage"]["completion_tokens"]

        began = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(num_requests)))
        wall = time.perf_counter() - began
    return {
        "concurrency": concurrency,
        "requests": num_requests,
        "max_tokens": max_tokens,
        "completion_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "mean_latency_s": sum(latencies) / len(latencies),
    }


def run_all(base_url: str, model: str, levels: list[int], max_tokens: int, rounds: int) -> list:
    results = []
    for level in levels:
        asyncio.run(measure(base_url, model, level, level, 8))  # warm-up at this batch size
        result = asyncio.run(measure(base_url, model, level, level * rounds, max_tokens))
        print(
            f"concurrency {level:>3}: {result['tokens_per_s']:8.1f} tokens/s "
            f"({result['completion_tokens']} tokens in {result['wall_s']:.1f} s, "
            f"mean latency {result['mean_latency_s']:.1f} s)",
            flush=True,
        )
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="an existing server (default: start one)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="requests per slot")
    args = parser.parse_args()

    if args.base_url:
        results = run_all(args.base_url, args.model, args.concurrency, args.max_tokens, args.rounds)
    else:
        from rlvr.server.process import VLLMServer

        with VLLMServer(args.model, extra_args=SERVER_FLAGS) as server:
            results = run_all(
                server.base_url, args.model, args.concurrency, args.max_tokens, args.rounds
            )
    save("serve_throughput", {"model": args.model, "results": results})


if __name__ == "__main__":
    main()
