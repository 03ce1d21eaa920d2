"""Raw vLLM generation throughput (tokens/s) at fixed concurrency: the baseline the training
pipeline is compared against (bench/train_step.py reports efficiency = its tokens/s / these).

Every request asks for exactly `--max-tokens` tokens (`ignore_eos`), so the server is kept at
the stated concurrency for the whole measurement. With `--adapter` (when it starts the server)
it also measures the same levels through one rank-16 LoRA adapter on every projection, in the
same run, loaded three ways (`<way>_vs_plain` = its tokens/s / the plain model's):

- `pushed_adapter`: pushed by `AdapterPush`, as the trainer pushes the policy;
- `loaded_once`: the same files loaded once by `/v1/load_lora_adapter`;
- `inplace_adapter`: the same files loaded with `load_inplace`, as adapter sync did before it
  loaded each version under its own name (vLLM then reloads it from disk at every step).

pushed vs loaded-once is the cost of the push path; loaded-once vs plain is vLLM's LoRA
arithmetic.

With `--executors` it starts the server twice instead, one after the other: its one CPU worker
in a process of its own (vLLM's default, `mp`) and inside the engine-core process (`uni`, what
vf-vllm runs on one CPU worker: `rlvr.server.launcher.engine_env`), and prints seconds to ready
and tokens/s of each (`uni_vs_mp`). Run:

    .venv/bin/python bench/serve_throughput.py [--adapter]       # starts vf-vllm on smollm2-135m
    .venv/bin/python bench/serve_throughput.py --executors --concurrency 32
    .venv/bin/python bench/serve_throughput.py --base-url http://127.0.0.1:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SERVER_FLAGS, save  # noqa: E402

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
    parser.add_argument(
        "--executors", action="store_true", help="one CPU worker in its own process vs in-engine"
    )
    args = parser.parse_args()

    if args.executors:
        save("serve_executors", executor_comparison(args))
        return

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
            payload.update(adapter_throughput(server.base_url, args, results))
    save("serve_throughput", payload)


EXECUTORS = {"mp": "1", "uni": "0"}
"""vLLM's executor for one CPU worker -> the VLLM_ENABLE_V1_MULTIPROCESSING that selects it."""


def executor_comparison(args: argparse.Namespace) -> dict:
    """Seconds to ready and tokens/s with the worker in its own process and in-engine."""
    from rlvr.server.process import VLLMServer

    out: dict = {"model": args.model}
    for executor, flag in EXECUTORS.items():
        print(f"{executor}:", flush=True)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": flag}
        began = time.perf_counter()
        with VLLMServer(args.model, extra_args=SERVER_FLAGS, env=env) as server:
            ready = time.perf_counter() - began
            print(f"ready after {ready:.1f} s", flush=True)
            results = run_all(
                server.base_url, args.model, args.concurrency, args.max_tokens, args.rounds
            )
        out[executor] = {"ready_s": ready, "results": results}
    mp, uni = out["mp"], out["uni"]
    out["uni_vs_mp"] = {
        "ready_s": uni["ready_s"] / mp["ready_s"],
        **{
            str(a["concurrency"]): b["tokens_per_s"] / a["tokens_per_s"]
            for a, b in zip(mp["results"], uni["results"], strict=True)
        },
    }
    print("uni_vs_mp=" + ", ".join(f"{k}: {v:.2f}" for k, v in out["uni_vs_mp"].items()))
    return out


def adapter_throughput(base_url: str, args: argparse.Namespace, plain: list[dict]) -> dict:
    """Throughput through the adapter loaded each way, and its ratio to `plain` per level."""
    import tempfile

    from rlvr.model.policy import save_adapter, trainable_state
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.control import ServerControl

    policy = random_adapter(args.model)
    out: dict = {}
    with (
        tempfile.TemporaryDirectory() as files,
        AdapterPush(ServerControl(base_url), base_url, "policy") as sync,
    ):
        sync.connect(policy)
        sync.push(0)
        save_adapter(policy, trainable_state(policy), Path(files))
        for way, inplace in (("loaded_once", False), ("inplace_adapter", True)):
            body = {"lora_name": way, "lora_path": files, "load_inplace": inplace}
            sync.control.post("/v1/load_lora_adapter", json=body)
        for way, name in (
            ("pushed_adapter", sync.served_name(0)),
            ("loaded_once", "loaded_once"),
            ("inplace_adapter", "inplace_adapter"),
        ):
            print(f"through the adapter, {way.replace('_', ' ')}:")
            results = run_all(base_url, name, args.concurrency, args.max_tokens, args.rounds)
            ratios = {
                str(p["concurrency"]): a["tokens_per_s"] / p["tokens_per_s"]
                for p, a in zip(plain, results, strict=True)
            }
            print(
                f"{way}_vs_plain="
                + ", ".join(f"{level}: {ratio:.2f}" for level, ratio in ratios.items())
            )
            out[f"{way}_results"], out[f"{way}_vs_plain"] = results, ratios
    return out


def random_adapter(model: str):
    """A rank-16 adapter on every projection, random (non-zero) like a trained one."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.config import LoraConfig
    from rlvr.model.names import resolve_model
    from rlvr.model.policy import apply_lora

    base = AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32)
    policy = apply_lora(base, LoraConfig(rank=16))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    return policy


if __name__ == "__main__":
    main()
