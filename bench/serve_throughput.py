"""Raw vLLM generation throughput (tokens/s) at fixed concurrency: the baseline the training
pipeline is compared against (bench/train_step.py reports efficiency = its tokens/s / these).

Every request asks for exactly `--max-tokens` tokens (`ignore_eos`), so the server is kept at
the stated concurrency for the whole measurement. With `--adapter` (when it starts the server)
it also loads a rank-16 LoRA adapter on every projection, as adapter sync serves the policy, and
measures the same levels through it: the price of serving base + adapter instead of a merged
model, in the same run (`adapter_vs_plain` = adapter tokens/s / plain tokens/s). Run:

    .venv/bin/python bench/serve_throughput.py [--adapter]       # starts vf-vllm on smollm2-135m
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
    parser.add_argument("--adapter", action="store_true", help="also measure through an adapter")
    args = parser.parse_args()

    if args.base_url:
        results = run_all(args.base_url, args.model, args.concurrency, args.max_tokens, args.rounds)
        save("serve_throughput", {"model": args.model, "results": results})
        return
    from rlvr.server.launcher import lora_flags
    from rlvr.server.process import VLLMServer

    flags = [*SERVER_FLAGS, *(lora_flags(16) if args.adapter else [])]
    with VLLMServer(args.model, extra_args=flags) as server:
        results = run_all(
            server.base_url, args.model, args.concurrency, args.max_tokens, args.rounds
        )
        payload: dict = {"model": args.model, "results": results}
        if args.adapter:
            with load_adapter(server.base_url, args.model):
                print("through a rank-16 LoRA adapter (adapter sync's served policy):")
                adapter = run_all(
                    server.base_url, "policy", args.concurrency, args.max_tokens, args.rounds
                )
            ratios = {
                str(p["concurrency"]): a["tokens_per_s"] / p["tokens_per_s"]
                for p, a in zip(results, adapter, strict=True)
            }
            print("adapter_vs_plain (tokens/s ratio): " + ", ".join(
                f"{level}: {ratio:.2f}" for level, ratio in ratios.items()))  # fmt: skip
            payload.update(adapter_results=adapter, adapter_vs_plain=ratios)
    save("serve_throughput", payload)


def load_adapter(base_url: str, model: str):
    """A rank-16 adapter on every projection, random (non-zero) like a trained one, pushed as
    adapter sync pushes it; close the returned sync when done with it."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.adapter_sync import AdapterSync
    from rlvr.config import LoraConfig
    from rlvr.models import resolve_model
    from rlvr.policy import apply_lora
    from rlvr.weights import ServerControl

    base = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32)
    policy = apply_lora(base, LoraConfig(rank=16))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    sync = AdapterSync(ServerControl(base_url), base_url, "policy")
    sync.connect(policy)
    sync.push()
    return sync


if __name__ == "__main__":
    main()
