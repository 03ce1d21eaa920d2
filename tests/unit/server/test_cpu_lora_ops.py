"""The CPU LoRA ops that multiply once per adapter slot compute what vLLM's per-token ops
compute: every op, mixed slots (a negative one included), 3-D and 4-D stacked weights, added
or written, a broadcast row, padding, a fused slice."""

from __future__ import annotations

import pytest
import torch
from vllm.lora.ops.torch_ops import lora_ops

from rlvr.server import cpu_lora_ops

SLOTS = torch.tensor([0, 2, -1, 2, 0, 1, -1, 2])


@pytest.fixture(scope="module")
def vllm_ops():
    """vLLM's own ops (this process never loads the plugin that replaces them)."""
    ops = {name: getattr(lora_ops, name) for name in cpu_lora_ops.OPS}
    assert all(op is not cpu_lora_ops.OPS[name] for name, op in ops.items())
    return ops


def stacked(out: int, inp: int, four_d: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(3, out, inp, generator=g)
    return weights[:, None] if four_d else weights


def both(vllm_ops, name: str, output: torch.Tensor, *args, **kwargs) -> None:
    """Run vLLM's op and ours on copies of `output`; they must agree."""
    theirs, ours = output.clone(), output.clone()
    vllm_ops[name](args[0], args[1], theirs, *args[2:], **kwargs)
    cpu_lora_ops.OPS[name](args[0], args[1], ours, *args[2:], **kwargs)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.equal(ours, output), "the op wrote nothing"


@pytest.mark.parametrize("four_d", [False, True])
def test_grouped_ops_equal_vllms_per_token_ops(vllm_ops, four_d):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(SLOTS), 12, generator=g)
    h = torch.randn(len(SLOTS), 4, generator=g)
    start = torch.randn(len(SLOTS), 20, generator=g)
    a, b = stacked(4, 12, four_d, 1), stacked(6, 4, four_d, 2)
    both(vllm_ops, "bgmv_shrink", torch.zeros(len(SLOTS), 4), x, a, SLOTS, scaling=0.5)
    for add in (True, False):
        both(vllm_ops, "bgmv_expand", start, h, b, SLOTS, add_inputs=add)  # padded output
        both(vllm_ops, "bgmv_expand_slice", start, h, b, SLOTS, 7, 6, add_inputs=add)
    one = torch.randn(1, 4, generator=g)  # one row broadcast over the output's rows
    both(vllm_ops, "bgmv_expand", start, one, b, SLOTS[:1], add_inputs=True)


def test_per_slot_is_the_per_token_formula():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(len(SLOTS), 5, generator=g), torch.randn(3, 7, 5, generator=g)
    expected = torch.einsum("bi,boi->bo", x, w[SLOTS])
    torch.testing.assert_close(cpu_lora_ops.per_slot(x, w, SLOTS, torch.float32), expected)
    empty = cpu_lora_ops.per_slot(x[:0], w, SLOTS[:0], torch.float32)
    assert empty.shape == (0, 7)
