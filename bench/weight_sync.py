"""Time to push SmolLM2-135M's weights into vf-vllm, every path in one run:

- `adapter`: LoRA adapter sync (rank 16 on all projections): only the adapter, loaded by
  vLLM on its frozen base (rlvr.weight_sync.adapter);
- `shm`, `gloo`: our cpu engine streaming the merged LoRA model (what `server.lora_sync=merged`
  and full fine-tuning push) through shared memory or a gloo group;
- `disk` (baseline): write the weights as safetensors and have the server reload them from disk
  (vLLM's `reload_weights` through /collective_rpc), as a trainer without a transfer engine
  would.

Merged pushes go into a server without LoRA (as `merged` sync runs), the adapter into one
started with `--enable-lora`. Every path pauses generation and resets the prefix cache. It also
reports the worker's own load time for merged pushes (from the server log), which no transport
removes, and prints `adapter_speedup_vs_merged=<p50 merged (shm) / p50 adapter>`. Run:

    .venv/bin/python bench/weight_sync.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SERVER_FLAGS, save, summary  # noqa: E402

from rlvr.model.names import ensure_embedded_model  # noqa: E402
from rlvr.server.launcher import lora_flags  # noqa: E402
from rlvr.server.process import VLLMServer  # noqa: E402
from rlvr.weight_sync.adapter import AdapterPush  # noqa: E402
from rlvr.weight_sync.control import ServerControl  # noqa: E402
from rlvr.weight_sync.merged import MergedPush  # noqa: E402
from rlvr.weight_sync.merged_stream import MergedWeightSource  # noqa: E402


def reload_from_disk(control: ServerControl, model, folder: Path) -> float:
    start = time.perf_counter()
    model.save_pretrained(folder, safe_serialization=True)
    control.pause()
    try:
        control.post(
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
        )
        control.reset_prefix_cache()
    finally:
        control.resume()
    return time.perf_counter() - start


def timed(push, version: int) -> float:
    """The seconds `push(version)` takes."""
    start = time.perf_counter()
    push(version)
    return time.perf_counter() - start


def worker_load_seconds(server_log: str) -> list[float]:
    """The worker's load time of each push after a transport's warm-up, from our engine's log
    line: the part of a push that is vLLM's own reload work, which no transport removes."""
    loads: list[float] = []
    for transport in ("shm", "gloo"):
        pattern = (
            rf"weight update \({transport}\): \d+ tensors arrived in [\d.]+s, loaded in ([\d.]+)s"
        )
        loads += [float(x) for x in re.findall(pattern, server_log)[1:]]
    return loads


def merged_pushes(policy, model, repeats: int, times: dict[str, list[float]]) -> list[float]:
    """shm, gloo and the disk baseline into a server without LoRA, as merged sync runs (vLLM's
    reload_weights cannot load into LoRA-wrapped layers); returns the worker's load times."""
    with (
        VLLMServer("smollm2-135m", extra_args=SERVER_FLAGS) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for transport in ("shm", "gloo"):
            with MergedPush(server.base_url, server.model, backend=transport) as sync:
                sync.connect(MergedWeightSource(policy))
                sync.push(0)  # warm-up: the first push allocates the buffers on both sides
                for i in range(repeats):
                    times[transport].append(timed(sync.push, i + 1))
                    folder = Path(tmp) / f"{transport}{i}"
                    times["disk"].append(reload_from_disk(sync.control, model, folder))
        return worker_load_seconds(server.log_path.read_text(errors="replace"))


def adapter_pushes(policy, repeats: int) -> list[float]:
    """Adapter sync into a LoRA-enabled server (vf-vllm --enable-lora)."""
    with VLLMServer("smollm2-135m", extra_args=[*SERVER_FLAGS, *lora_flags(16)]) as server:
        with AdapterPush(ServerControl(server.base_url), server.base_url, "policy") as sync:
            sync.connect(policy)
            sync.push(0)  # warm-up: vLLM allocates the adapter's slot
            return [timed(sync.push, version) for version in range(1, repeats + 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from rlvr.config import LoraConfig
    from rlvr.model.policy import apply_lora

    model_dir = ensure_embedded_model()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    # the disk baseline saves a plain copy: apply_lora wraps `model`'s layers in place
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    policy = apply_lora(model, LoraConfig(rank=16))  # every projection, as the trainer's default
    adapter_mb = sum(p.numel() * 4 for p in policy.parameters() if p.requires_grad) / 2**20
    times: dict[str, list[float]] = {"adapter": [], "shm": [], "gloo": [], "disk": []}
    times["adapter"] = adapter_pushes(policy, args.repeats)
    loads = merged_pushes(policy, plain, args.repeats, times)
    stats = {name: summary(values) for name, values in times.items()}
    speedups = {t: stats["disk"]["p50"] / stats[t]["p50"] for t in ("adapter", "shm", "gloo")}
    adapter_vs_merged = stats["shm"]["p50"] / stats["adapter"]["p50"]
    load = summary(loads)
    labels = {
        "adapter": f"adapter sync ({adapter_mb:.0f} MiB)",
        "shm": "merged, cpu engine shm (ours)",
        "gloo": "merged, cpu engine gloo (ours)",
        "disk": "safetensors + server reload",
    }
    print(f"SmolLM2-135M float32, {size_mb:.0f} MiB, {len(times['shm'])} pushes per path")
    print(f"{'path':<32}{'p50 s':>10}{'mean s':>10}{'min s':>10}{'speed-up':>10}")
    for name, st in stats.items():
        ratio = f"{speedups[name]:.1f}x" if name in speedups else "1.0x"
        print(
            f"{labels[name]:<32}{st['p50']:>10.3f}{st['mean']:>10.3f}{st['min']:>10.3f}{ratio:>10}"
        )
    print("speed-up = baseline p50 / path p50")
    print(f"adapter_speedup_vs_merged={adapter_vs_merged:.1f} (target >= 10)")
    ceiling = stats["disk"]["p50"] / load["p50"]
    print(
        f"of which the worker's own load (vLLM's layerwise reload, oneDNN repacking), which the "
        f"baseline pays too: p50 {load['p50']:.3f} s, so no transport can beat {ceiling:.1f}x"
    )
    save(
        "weight_sync",
        {
            "model_mib": size_mb,
            "seconds": stats,
            "adapter_mib": adapter_mb,
            "speedup_p50": speedups,
            "adapter_speedup_vs_merged": adapter_vs_merged,
            "worker_load_seconds": load,
            "speedup_ceiling_p50": ceiling,
        },
    )


if __name__ == "__main__":
    main()
