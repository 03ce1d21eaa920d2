"""Quantized bases (QLoRA, rlvr.model.quantization): each quantized layer computes with exactly
the dequantized weight that the merged stream sends and the merge writes, in every mode."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file

from rlvr.config import ConfigError, SFTConfig, load_config
from rlvr.model.merge import merge_adapter, merge_statement
from rlvr.model.policy import load_model, load_policy, save_adapter, trainable_state
from rlvr.model.quantization import (
    dequantize_model,
    dequantized_weight,
    is_quantized_layer,
    quantization_of,
)
from rlvr.trainer.memory import ModelShape
from rlvr.weight_sync.merged_stream import MergedWeightSource

MODES = ["nf4", "int8"]
TARGETS = "[q_proj,v_proj,up_proj,down_proj]"


def policy_cfg(model_dir, quantization: str, *extra: str):
    return load_config(
        overrides=[
            f"model.name={model_dir}",
            "model.dtype=float32",
            f"model.quantization={quantization}",
            f"lora.target_modules={TARGETS}",
            *extra,
        ]
    )


def quantized_policy(model_dir, quantization: str, *extra: str):
    """A LoRA policy on a quantized tiny model, its adapter moved away from zero."""
    cfg = policy_cfg(model_dir, quantization, *extra)
    torch.manual_seed(0)
    policy = load_policy(cfg.model, cfg.lora, Accelerator(cpu=True))
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return policy


def quantized_layers(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if is_quantized_layer(m)]


def test_full_finetune_on_a_quantized_base_is_refused(tiny_model_dir):
    for quantization in MODES:
        with pytest.raises(ConfigError, match="model.quantization.*lora.enabled=true"):
            policy_cfg(tiny_model_dir, quantization, "lora.enabled=false")
        with pytest.raises(ConfigError, match="model.quantization"):
            load_config(
                cls=SFTConfig,
                overrides=[
                    "data.train_files=[x.jsonl]",
                    f"model.quantization={quantization}",
                    "lora.enabled=false",
                ],
            )
    with pytest.raises(ConfigError, match="model.quantization"):
        policy_cfg(tiny_model_dir, "int4")


@pytest.mark.parametrize("quantization", MODES)
def test_every_layer_computes_with_its_dequantized_weight(tiny_model_dir, quantization):
    """train and eval mode, with and without gradients: y == x @ W.T + b exactly, W the
    dequantized weight, and eval mode does not change it (bitsandbytes would repack 4-bit
    weights for a bf16 kernel, and quantize int8 activations)."""
    model = load_model(str(tiny_model_dir), policy_cfg(tiny_model_dir, quantization).model)
    layers = quantized_layers(model)
    assert quantization_of(model) == quantization
    assert len(layers) == 7 * model.config.num_hidden_layers  # every projection, not lm_head
    assert not is_quantized_layer(model.lm_head)
    x = torch.randn(3, 5, model.config.hidden_size)
    for layer in layers[:4]:
        before = dequantized_weight(layer).clone()
        expected = torch.nn.functional.linear(x[..., : layer.in_features], before, layer.bias)
        for training, grad in ((True, True), (False, False), (True, False)):
            layer.train(training)
            inp = x[..., : layer.in_features].clone().requires_grad_(grad)
            assert torch.equal(layer(inp), expected), (training, grad)
        assert torch.equal(dequantized_weight(layer), before)


@pytest.mark.parametrize("quantization", MODES)
def test_quantizing_is_deterministic_and_smaller(tiny_model_dir, quantization):
    cfg = policy_cfg(tiny_model_dir, quantization).model
    a, b = load_model(str(tiny_model_dir), cfg), load_model(str(tiny_model_dir), cfg)
    for la, lb in zip(quantized_layers(a), quantized_layers(b), strict=True):
        assert torch.equal(dequantized_weight(la), dequantized_weight(lb))
    plain = load_model(str(tiny_model_dir), policy_cfg(tiny_model_dir, "none").model)
    quantized, full = ModelShape.of(a), ModelShape.of(plain)
    assert quantized.dtype_bytes == 4 and full.weight_bytes is None
    linears = [m for n, m in plain.named_modules() if type(m) is torch.nn.Linear and n != "lm_head"]
    linear = sum(m.weight.numel() for m in linears)
    largest = max(m.weight.numel() for m in linears)
    if quantization == "nf4":  # half a byte per weight, a float32 absmax per block of 64
        stored = linear // 2 + linear // 64 * 4
    else:  # a byte per weight, a float32 absmax per row
        stored = linear + sum(m.out_features for m in linears) * 4
    # the linear weights' float32 bytes become their storage, plus the largest layer's
    # dequantized copies in forward and backward
    assert quantized.weight_bytes == full.params * 4 - linear * 4 + stored + 2 * largest * 4


@pytest.mark.parametrize("quantization", MODES)
def test_merged_stream_sends_what_the_trainer_computes_with(tiny_model_dir, quantization):
    policy = quantized_policy(tiny_model_dir, quantization)
    plain = load_model(str(tiny_model_dir), policy_cfg(tiny_model_dir, "none").model)
    expected = plain.state_dict()
    for with_adapters in (False, True):
        source = MergedWeightSource(policy.model, with_adapters=with_adapters)
        meta = {m.name: m for m in source.metadata()}
        tensors = dict(iter(source))
        assert (
            set(meta)
            == set(tensors)
            == {k for k in expected if k != "lm_head.weight"}
            | ({"lm_head.weight"} if "lm_head.weight" in tensors else set())
        )
        for name, tensor in tensors.items():
            assert tuple(tensor.shape) == meta[name].shape == tuple(expected[name].shape), name
            assert tensor.dtype == meta[name].dtype == torch.float32, name
        # the served model (these tensors in a plain model) computes what the trainer does
        served = load_model(str(tiny_model_dir), policy_cfg(tiny_model_dir, "none").model)
        served.load_state_dict(tensors, strict=False)
        ids = torch.randint(0, plain.config.vocab_size, (2, 12))
        policy.model.eval()
        if with_adapters:
            trainer = policy.model(input_ids=ids).logits
        else:
            with policy.model.disable_adapter():
                trainer = policy.model(input_ids=ids).logits
        assert (served(input_ids=ids).logits - trainer).abs().max() < 1e-5
    # ...and not what the unquantized original computes
    assert (plain(input_ids=ids).logits - trainer).abs().max() > 1e-3


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    grads = []
    for checkpointing in (False, True):
        policy = quantized_policy(tiny_model_dir, "nf4")
        if checkpointing:
            policy.model.gradient_checkpointing_enable({"use_reentrant": False})
        policy.model.train()
        ids = torch.randint(0, 400, (2, 16), generator=torch.Generator().manual_seed(0))
        policy.model(input_ids=ids, labels=ids).loss.backward()
        named = policy.model.named_parameters()
        grads.append({n: p.grad.clone() for n, p in named if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and all(g.abs().sum() > 0 for g in grads[0].values())
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-6), name


def test_merge_says_and_uses_the_base_the_adapter_trained_on(tiny_model_dir, tmp_path):
    policy = quantized_policy(tiny_model_dir, "nf4")
    adapter = tmp_path / "adapter"
    save_adapter(policy.model, trainable_state(policy.model), adapter)
    ids = torch.randint(0, 400, (2, 12))
    policy.model.eval()
    trained = policy.model(input_ids=ids).logits
    for into in ("trained", "original"):
        out = merge_adapter(adapter, tmp_path / into, into=into)
        merged = load_model(str(out), policy_cfg(out, "none").model)
        assert "quantization_config" not in (out / "config.json").read_text()
        diff = (merged(input_ids=ids).logits - trained).abs().max().item()
        assert diff < 1e-5 if into == "trained" else diff > 1e-3, (into, diff)
    assert "nf4-dequantized base the adapter was trained on" in merge_statement(adapter, "trained")
    assert "ORIGINAL unquantized base" in merge_statement(adapter, "original")
    weights = load_file(tmp_path / "trained" / "model.safetensors")
    assert all(w.dtype == torch.float32 for w in weights.values())


def trained_weights(policy) -> dict[str, torch.Tensor]:
    """The weights a LoRA policy computes with, in float32: its base as the layers compute with
    it (dequantized), plus each adapter's delta."""
    weights = {n: t.float() for n, t in MergedWeightSource(policy.model, with_adapters=False)}
    for name, module in policy.model.get_base_model().named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            weights[f"{name}.weight"] += module.get_delta_weight("default").float()
    return weights


def test_qlora_merge_rebuilds_the_trained_base(tiny_model_dir, tmp_path, monkeypatch):
    """A bfloat16 run quantizes the float32 checkpoint's weights rounded to bfloat16 (other
    nf4 codes than quantizing them from float32): the merge into `trained` and the warm-start
    push rebuild that base from the dtype recorded beside the adapter, so the merged model
    is the trained policy to float rounding and the push streams what the run streamed."""
    import json

    import rlvr.weight_sync.merged as merged_module

    policy = quantized_policy(tiny_model_dir, "nf4", "model.dtype=bfloat16")
    assert policy.model.get_base_model().model.embed_tokens.weight.dtype == torch.bfloat16
    adapter = tmp_path / "adapter"
    save_adapter(policy.model, trainable_state(policy.model), adapter)
    recorded = json.loads((adapter / "base_quantization.json").read_text())
    assert recorded == {"quantization": "nf4", "dtype": "bfloat16"}
    assert "quantized from bfloat16" in merge_statement(adapter, "trained")

    out = merge_adapter(adapter, tmp_path / "merged", into="trained")
    merged = load_file(out / "model.safetensors")
    expected = trained_weights(policy)
    assert set(merged) == set(expected)
    for name, weight in expected.items():
        assert merged[name].dtype == torch.float32, name
        torch.testing.assert_close(merged[name], weight, rtol=0, atol=1e-6, msg=name)

    pushed = {}

    class Recorder:  # MergedPush without a server: what the push would stream
        def __init__(self, base_url, model):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def connect(self, source):
            self.source = source

        def push(self, version):
            pushed.update(dict(iter(self.source)))
            return 0.0

    monkeypatch.setattr(merged_module, "MergedPush", Recorder)
    merged_module.push_merged_adapter("http://unused", str(tiny_model_dir), adapter)
    streamed = dict(iter(MergedWeightSource(policy.model)))
    assert set(pushed) == set(streamed)
    for name, tensor in streamed.items():
        assert torch.equal(pushed[name], tensor), name


def test_dequantized_model_is_plain(tiny_model_dir):
    model = load_model(str(tiny_model_dir), policy_cfg(tiny_model_dir, "int8").model)
    weights = {id(m): dequantized_weight(m) for m in quantized_layers(model)}
    assert len(weights) > 0
    dequantize_model(model)
    assert quantization_of(model) == "none" and not quantized_layers(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_sft_trains_a_qlora_adapter(tiny_model_dir, shared_data, tmp_path):
    from rlvr.trainer.sft import SFTTrainer

    cfg = load_config(
        cls=SFTConfig,
        overrides=[
            f"model.name={tiny_model_dir}",
            "model.quantization=nf4",
            "model.gradient_checkpointing=true",
            f"data.train_files=[{shared_data / 'gsm8k' / 'test.jsonl'}]",
            "data.format=prompt_completion",
            "data.prompt_column=question",
            "data.completion_column=answer",
            "data.max_seq_len=128",
            "data.max_examples=16",
            "train.batch_size=8",
            "train.micro_batch_size=4",
            "train.max_steps=2",
            "optim.lr=1e-2",
            f"lora.target_modules={TARGETS}",
            "checkpoint.every=0",
            "wandb.mode=disabled",
            f"output_dir={tmp_path}",
        ],
    )
    history = SFTTrainer(cfg).run()
    assert len(history) == 2 and all(0 < h["train/loss"] < 10 for h in history)
    adapter = load_file(tmp_path / "final" / "adapter_model.safetensors")
    assert sum(w.abs().sum().item() for k, w in adapter.items() if "lora_B" in k) > 0
    assert (tmp_path / "final" / "base_quantization.json").is_file()
