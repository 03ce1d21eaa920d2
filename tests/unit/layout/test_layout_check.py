"""The start-up self-check of the shared layouts (rlvr.layout.layout_check): a model that gives a
tiny folded or packed batch the unshared log-probabilities keeps the layout; a model class that
drops the layout's mask is caught, and the run trains unshared with a warning naming it."""

from __future__ import annotations

import logging

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2ForCausalLM

from rlvr.config import load_config
from rlvr.layout.layout_check import check_shared_layouts
from rlvr.trainer.logprobs import token_logprobs


class DropsTheMask(Qwen2ForCausalLM):
    """Ignores the attention mask and the tree's node plan it is given (as a model with an
    attention of its own would): a folded row's tokens then read their siblings."""

    def forward(self, input_ids=None, attention_mask=None, tree_plan=None, **kwargs):
        return super().forward(input_ids=input_ids, **kwargs)


class IgnoresPacking(Qwen2ForCausalLM):
    """Builds a plain causal mask whatever the position ids say: a packed row's samples then
    read the samples before them (as models whose code predates packed rows do)."""

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return super().forward(input_ids=input_ids, attention_mask=mask, **kwargs)


@pytest.mark.parametrize(
    ("model_class", "switched_off"),
    [
        (Qwen2ForCausalLM, set()),
        (DropsTheMask, {"prefix_sharing"}),
        (IgnoresPacking, {"packing"}),
    ],
    ids=["honours-both", "drops-the-mask", "ignores-packing"],
)
def test_folded_batch_self_check(tiny_model_dir, caplog, model_class, switched_off):
    batch = load_config(overrides=["batch.prefix_sharing=true", "batch.packing=true"]).batch
    model = model_class.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(target_modules=["q_proj"])).train()  # as GRPO runs
    with caplog.at_level(logging.WARNING, logger="rlvr.layout.layout_check"):
        checked = check_shared_layouts(
            token_logprobs, model, batch, 0, torch.device("cpu"), torch.float32
        )
    kept = {"prefix_sharing", "packing"} - switched_off
    assert {name for name in kept if getattr(checked, name)} == kept
    assert not any(getattr(checked, name) for name in switched_off)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(switched_off)
    for name, message in zip(sorted(switched_off), warnings, strict=True):
        assert f"batch.{name} is switched off" in message and model_class.__name__ in message


def test_the_self_check_runs_only_for_the_layouts_asked_for(tiny_model_dir, monkeypatch):
    from rlvr.layout import layout_check

    def forbidden(*args, **kwargs):
        raise AssertionError("no forward without a shared layout")

    monkeypatch.setattr(layout_check, "layout_errors", forbidden)
    batch = load_config(overrides=["batch.prefix_sharing=false", "batch.packing=false"]).batch
    model = DropsTheMask.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    assert (
        check_shared_layouts(token_logprobs, model, batch, 0, torch.device("cpu"), torch.float32)
        == batch
    )
