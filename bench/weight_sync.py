"""Time to push SmolLM2-135M's weights into vf-vllm: our cpu engine (shm and gloo transports)
vs. the naive baseline.

Baseline: write the weights as safetensors and have the server reload them from disk
(vLLM's `reload_weights` through /collective_rpc), as a trainer without a transfer engine would.
Both paths pause generation and reset the prefix cache, so they do the same job. Run:

    .venv/bin/python bench/weight_sync.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save, summary  # noqa: E402

from rlvr.models import ensure_embedded_model  # noqa: E402
from rlvr.server.process import VLLMServer  # noqa: E402
from rlvr.weights import ServerControl, WeightSync  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    model_dir = ensure_embedded_model()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    size_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    flags = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
    times: dict[str, list[float]] = {"shm": [], "gloo": [], "disk": []}
    with (
        VLLMServer("smollm2-135m", extra_args=flags) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for transport in ("shm", "gloo"):
            with WeightSync(server.base_url, backend=transport) as sync:
                sync.connect(model)
                sync.push()  # warm-up: the first push allocates the buffers on both sides
                for i in range(args.repeats):
                    start = time.perf_counter()
                    sync.push()
                    times[transport].append(time.perf_counter() - start)
                    folder = Path(tmp) / f"{transport}{i}"
                    times["disk"].append(reload_from_disk(sync.control, model, folder))
    stats = {name: summary(values) for name, values in times.items()}
    speedups = {t: stats["disk"]["p50"] / stats[t]["p50"] for t in ("shm", "gloo")}
    labels = {
        "shm": "cpu engine, shm (ours)",
        "gloo": "cpu engine, gloo (ours)",
        "disk": "safetensors + server reload",
    }
    print(f"SmolLM2-135M float32, {size_mb:.0f} MiB, {len(times['shm'])} pushes per path")
    print(f"{'path':<32}{'p50 s':>10}{'mean s':>10}{'min s':>10}{'speed-up':>10}")
    for name, st in stats.items():
        ratio = f"{speedups[name]:.1f}x" if name in speedups else "1.0x"
        print(
            f"{labels[name]:<32}{st['p50']:>10.3f}{st['mean']:>10.3f}{st['min']:>10.3f}{ratio:>10}"
        )
    print("speed-up = baseline p50 / path p50 (target >= 5x)")
    save("weight_sync", {"model_mib": size_mb, "seconds": stats, "speedup_p50": speedups})


if __name__ == "__main__":
    main()
