"""Time to push SmolLM2-135M's weights into vf-vllm: our cpu engine (shm and gloo transports)
vs. the naive baseline.

Baseline: write the weights as safetensors and have the server reload them from disk
(vLLM's `reload_weights` through /collective_rpc), as a trainer without a transfer engine would.
Both paths pause generation and reset the prefix cache, so they do the same job. It also
reports the worker's own load time (from the server log), which both paths pay, and the
speed-up ceiling that follows from it. Run:

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
        loads = worker_load_seconds(server.log_path.read_text(errors="replace"))
    stats = {name: summary(values) for name, values in times.items()}
    speedups = {t: stats["disk"]["p50"] / stats[t]["p50"] for t in ("shm", "gloo")}
    load = summary(loads)
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
            "speedup_p50": speedups,
            "worker_load_seconds": load,
            "speedup_ceiling_p50": ceiling,
        },
    )


if __name__ == "__main__":
    main()
