"""The shared layouts' start-up self-check and flex attention's tree block mask, in one run.

1. Self-check margins (`--parts check`). rlvr.layout.layout_check's `layout_errors` on the
   tiny Qwen2 model and SmolLM2-135M, in float32 and bfloat16 with sdpa: the honest model
   class, one that drops the attention mask it is given (a folded row's tokens then read
   their siblings), one that builds a plain causal mask whatever the position ids say (a
   packed row's samples read the ones before them) and one that drops both mask and position
   ids. Each layout's error on samples placed after another (`shared`) and on the first
   sample of a row (`control`, rounding alone), and whether the check passes it.
2. Flex block mask (`--parts flex`). Building the block mask of folded rows (a quarter of each
   row a prompt every token reads) with flex attention's eager `create_block_mask` and with
   rlvr.layout.folded's compiled one, each in a fresh process: seconds per call (the
   compiled one's first call includes compilation), the rise of the process's peak resident
   memory over its level before the call (the eager 16k case needs about 10 GiB free), and
   up to 4k tokens whether the compiled mask equals the eager one.

Results: bench/results/shared_layouts_check.json and shared_layouts_flex.json.

Run:  .venv/bin/python bench/shared_layouts.py [--parts check flex]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

SHAPES = [(2, 1024), (3, 2048), (4, 3000), (4, 16384)]
"""(rows, width) of the folded micro-batches whose block mask part 2 builds, in this order."""
EAGER_CHECK_WIDTH = 4096
"""Up to this width the compiled mask is also compared with the eager one, block for block."""


def model_variants(base: type) -> dict[str, type]:
    """The honest class `base` and three that do not honour a shared layout's mask."""
    import torch

    class DropsMask(base):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            return super().forward(input_ids=input_ids, **kwargs)

    class IgnoresPacking(base):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            return super().forward(input_ids=input_ids, attention_mask=mask, **kwargs)

    class DropsMaskAndPositions(base):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs):
            return super().forward(input_ids=input_ids, **kwargs)

    return {
        "honest": base,
        "drops_mask": DropsMask,
        "ignores_packing": IgnoresPacking,
        "drops_mask_and_positions": DropsMaskAndPositions,
    }


def check_margins() -> list[dict]:
    import torch
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    from rlvr.layout.layout_check import layout_errors, tolerance
    from rlvr.model.names import ensure_embedded_model
    from rlvr.model.tiny_model import build_tiny_model
    from rlvr.trainer.logprobs import token_logprobs

    tiny = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    models = [
        ("tiny-qwen2", tiny, Qwen2ForCausalLM),
        ("smollm2-135m", ensure_embedded_model(), LlamaForCausalLM),
    ]
    rows = []
    for name, path, base in models:
        for dtype in (torch.float32, torch.bfloat16):
            for variant, cls in model_variants(base).items():
                model = cls.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").train()
                errors = layout_errors(
                    token_logprobs, model, 0, torch.device("cpu"), "sdpa", packing=True
                )
                for layout, error in errors.items():
                    row = {
                        "model": name,
                        "dtype": str(dtype),
                        "variant": variant,
                        "layout": layout,
                        "shared": error.shared,
                        "control": error.control,
                        "passes": error.honoured(tolerance(dtype)),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def build_masks(mode: str) -> None:
    """Child process: build each SHAPES block mask with `mode` (eager or compiled); print one
    JSON line per shape."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from rlvr.layout.folded import compiled_block_mask, visibility

    build = compiled_block_mask() if mode == "compiled" else create_block_mask
    for rows, width in SHAPES:
        scope_end = torch.arange(1, width + 1).repeat(rows, 1)
        scope_end[:, : width // 4] = width
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        began = time.perf_counter()
        mask = build(visibility(scope_end), rows, None, width, width, device="cpu")
        seconds = time.perf_counter() - began
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        row = {
            "mode": mode,
            "rows": rows,
            "width": width,
            "seconds": seconds,
            "peak_rss_rise_mib": grew / 1024,
        }
        if mode == "compiled" and width <= EAGER_CHECK_WIDTH:  # the same blocks as eagerly
            eager = create_block_mask(visibility(scope_end), rows, None, width, width, "cpu")
            pairs = zip(mask.as_tuple(), eager.as_tuple(), strict=True)
            row["equals_eager"] = all(torch.equal(a, b) for a, b in pairs if torch.is_tensor(a))
        print(json.dumps(row), flush=True)


def flex_masks() -> list[dict]:
    rows = []
    for mode in ("eager", "compiled"):
        done = subprocess.run(
            [sys.executable, __file__, "--child", mode], check=True, capture_output=True, text=True
        )
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
                print(line, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=["check", "flex"], default=["check", "flex"])
    parser.add_argument("--child", choices=["eager", "compiled"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        build_masks(args.child)
        return
    if "check" in args.parts:
        save("shared_layouts_check", {"self_check": check_margins()})
    if "flex" in args.parts:
        save("shared_layouts_flex", {"flex_block_mask": flex_masks()})


if __name__ == "__main__":
    main()
