"""vLLM's CPU LoRA expand op against rlvr's (`rlvr.server.cpu_lora_ops`) at SmolLM2-135M's
widest LoRA shapes: B of gate/up (2 x 1536 outputs) at the rank vf-vllm's servers pad
adapters to (64), on prefills of 64 to 5,280 tokens (one batch of 64 GSM8K prompts) shared by
two adapter slots, as a run with adapter pushes has (this version and the last).

vLLM's op copies each token's B matrix and contracts per token; ours multiplies each slot's
rows once. Both run in this process on the same inputs; the figure is their ratio (the machine
is noisy), and the outputs are compared. Run (about a minute on 2 cores):

    .venv/bin/python bench/cpu_lora.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from vllm.lora.ops.torch_ops import lora_ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

from rlvr.server.cpu_lora_ops import bgmv_expand_slice  # noqa: E402

OUT, RANK, SLOTS = 1536, 64, 2


def seconds(op, *args, repeats: int) -> float:
    """The fastest of `repeats` calls of `op(*args)`."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        op(*args)
        best = min(best, time.perf_counter() - start)
    return best


def measure(tokens: int, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(tokens)
    h = torch.randn(tokens, RANK, generator=g)
    b = torch.randn(SLOTS, 1, 2 * OUT, RANK, generator=g)
    slots = torch.randint(0, SLOTS, (tokens,), generator=g)
    theirs, ours = torch.zeros(tokens, 2 * OUT), torch.zeros(tokens, 2 * OUT)
    vllm_s = seconds(
        lora_ops.bgmv_expand_slice, h, b, theirs, slots, 0, 2 * OUT, False, repeats=repeats
    )
    ours_s = seconds(bgmv_expand_slice, h, b, ours, slots, 0, 2 * OUT, False, repeats=repeats)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    row = {"tokens": tokens, "vllm_s": vllm_s, "rlvr_s": ours_s, "speedup": vllm_s / ours_s}
    print(
        f"{tokens:>5} tokens: vLLM {vllm_s * 1e3:9.1f} ms, rlvr {ours_s * 1e3:7.1f} ms, "
        f"{row['speedup']:6.1f}x"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 1024, 5280])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(n, args.repeats) for n in args.tokens]
    save("cpu_lora", {"out": 2 * OUT, "rank": RANK, "slots": SLOTS, "rows": rows})


if __name__ == "__main__":
    main()
