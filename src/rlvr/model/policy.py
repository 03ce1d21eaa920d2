"""The trainable policy, for every trainer (GRPO and SFT): loading it and its final save.

`load_policy` loads the tokenizer and the weights (float32 wherever the optimizer updates them,
a half dtype computing under autocast), wraps them in LoRA and, for a sampled policy, turns
dropout off; gradient checkpointing is the trainer's decision (`enable_gradient_checkpointing`).
`save_final` writes the adapter or the full model in Hugging Face format. Nothing here imports
vLLM, so SFT runs on training-only hosts. Design: docs/training.md#precision-seeds-and-policy-lag.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.atomic import atomic_directory
from rlvr.config import ConfigError, LoraConfig, ModelConfig
from rlvr.model.quantization import (
    bnb_config,
    prepare_quantized,
    quantization_of,
    quantized_from,
)
from rlvr.model.zero3 import zero3_gather
from rlvr.reasoning_vocab.hooks import PolicyHooks, policy_hooks
from rlvr.reasoning_vocab.mapping import ReasoningVocab, expand_model, load_tokenizer
from rlvr.reasoning_vocab.mapping import attach as attach_reasoning_vocab

log = logging.getLogger(__name__)


@dataclass
class Policy:
    model: torch.nn.Module
    """The model to train: a PeftModel when LoRA is on, else the Hugging Face model."""
    tokenizer: Any
    pad_id: int
    """The tokenizer's pad token, or its EOS where it has none (padding is masked anyway)."""
    path: str
    """Where the weights came from (a local directory or a hub id)."""
    reasoning_vocab: ReasoningVocab | None = None
    """The model's reasoning vocabulary (`tokenizer` is then the expanded one), or None."""
    compute_dtype: torch.dtype | None = None
    """Set when float32 weights compute in a half dtype (`master_weights_dtype`): the dtype
    pushed weights travel in."""
    hooks: PolicyHooks = field(default_factory=PolicyHooks)
    """What the policy's extension (a reasoning vocabulary) adds to a step; no-ops without."""


def resolve_dtype(name: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    return getattr(torch, name)


def master_weights_dtype(cfg: ModelConfig, lora: bool, deepspeed: bool) -> torch.dtype | None:
    """The half dtype a full fine-tune computes in over float32 weights (None: the weights
    load in the configured dtype as they are). Every weight the optimizer updates is float32:
    a bfloat16 weight drops AdamW updates under half its step; LoRA's adapter (PEFT) and
    DeepSpeed's master weights are float32 already."""
    dtype = resolve_dtype(cfg.dtype)
    if lora or deepspeed or dtype == torch.float32:
        return None
    return dtype


def mixed_precision(model: torch.nn.Module, dtype: torch.dtype, device_type: str) -> None:
    """Run the model's forward, and its output head (which `rlvr.trainer.logprobs` calls on its
    own), under autocast to `dtype`: matmuls in `dtype`, reductions and the weights float32."""
    head = model.get_output_embeddings()
    for module in (model, head):
        module.forward = torch.autocast(device_type, dtype=dtype)(module.forward)


def num_parameters(model: torch.nn.Module) -> int:
    """Parameter count, also when ZeRO-3 has partitioned the parameters to empty tensors."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def load_model(
    path: str,
    cfg: ModelConfig,
    reasoning_vocab: ReasoningVocab | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
) -> torch.nn.Module:
    """The plain Hugging Face model at `path` in `dtype` (default: `cfg`'s) and `cfg`'s
    attention implementation (also used for the frozen reference of a full fine-tune),
    expanded by `reasoning_vocab` when it does not carry it yet. With `cfg.quantization` its
    linear layers are quantized as they load, on `device` (default: the CPU), where they stay."""
    from transformers import AutoModelForCausalLM

    dtype = dtype or resolve_dtype(cfg.dtype)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    quantized = bnb_config(cfg.quantization, dtype)
    if quantized is not None:
        kwargs.update(quantization_config=quantized, device_map={"": device or "cpu"})
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if quantized is not None:
        prepare_quantized(model, dtype)
    if reasoning_vocab is not None and ReasoningVocab.load(path) is None:
        expand_model(model, reasoning_vocab)
    return model


# The frozen copy of a resumed adapter that serves as the KL reference (see `reference_mode`).
REFERENCE_ADAPTER = "reference"
TIED_MODULES = ("lm_head", "embed_tokens")


def check_lora_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Refuse LoRA on a tied output head or input embedding: PEFT adds the delta to one use
    of the shared matrix only, but the merged weight pushed into vLLM (which ties them too)
    would change both, so the server would sample from a model the trainer is not training."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    hit = sorted(set(targets) & set(TIED_MODULES))
    if tied and hit:
        raise ConfigError(
            f"lora.target_modules includes {hit}, but this model ties its input embedding and "
            "output head: the adapter's delta would reach only one of the two in training and "
            "both on the server. Remove them from lora.target_modules (or use a model with "
            "untied embeddings)."
        )


def apply_lora(
    model: torch.nn.Module,
    cfg: LoraConfig,
    keep_reference: bool = False,
    reasoning_vocab: ReasoningVocab | None = None,
) -> torch.nn.Module:
    """Wrap `model` with a trainable LoRA adapter: a new one, or `cfg.resume_from`'s.
    `keep_reference` (a KL penalty) also loads a resumed adapter frozen, as the reference.
    A reasoning vocabulary's rows train in full beside the adapter (`trainable_rows`): a
    low-rank update could not move N new rows independently of the originals they copy."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import PeftModel, get_peft_model

    check_lora_targets(model, list(cfg.target_modules))
    if cfg.resume_from:
        model = PeftModel.from_pretrained(model, cfg.resume_from, is_trainable=True)
        if keep_reference:
            model.load_adapter(cfg.resume_from, adapter_name=REFERENCE_ADAPTER)
            model.set_adapter("default")
        return model
    peft_config = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
        trainable_token_indices=trainable_rows(model, reasoning_vocab, cfg.target_modules),
    )
    return get_peft_model(model, peft_config)


def trainable_rows(
    model: torch.nn.Module, reasoning_vocab: ReasoningVocab | None, lora_targets: list[str]
) -> dict[str, list[int]] | None:
    """PEFT's `trainable_token_indices` for the reasoning rows, by module name. An untied head
    that LoRA already targets is left to LoRA (PEFT cannot wrap it twice; its LoRA update
    gives each output row, the new ones included, its own coefficients)."""
    if reasoning_vocab is None:
        return None
    rows = list(range(reasoning_vocab.base_vocab_size, reasoning_vocab.total_vocab_size))
    names = {module: name.rsplit(".", 1)[-1] for name, module in model.named_modules()}
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    indices = {names[embedding]: rows}
    untied = head is not None and head.weight is not embedding.weight
    if untied and names[head] not in lora_targets:
        indices[names[head]] = rows
    return indices


@contextlib.contextmanager
def reference_mode(model: torch.nn.Module):
    """Run a LoRA policy as its KL reference, the initial policy: the frozen copy of a resumed
    adapter where there is one (`apply_lora(keep_reference=True)`), else the base with the
    adapter off (a new adapter starts at zero, so the base is the initial policy). Switches
    the active adapter of each LoRA layer directly: PEFT's `set_adapter` would also change
    which parameters are trainable."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    unwrapped = getattr(model, "module", model)
    if REFERENCE_ADAPTER not in getattr(unwrapped, "peft_config", {}):
        with unwrapped.disable_adapter():
            yield
        return
    layers = [m for m in unwrapped.modules() if isinstance(m, BaseTunerLayer)]
    saved = [m._active_adapter for m in layers]
    for layer in layers:
        layer._active_adapter = [REFERENCE_ADAPTER]
    try:
        yield
    finally:
        for layer, active in zip(layers, saved, strict=True):
            layer._active_adapter = active


def load_policy(
    model_cfg: ModelConfig,
    lora_cfg: LoraConfig,
    accelerator: Any,
    keep_reference: bool = False,
    sampled_len: int | None = None,
) -> Policy:
    """Everything a trainer needs to start training the model `model_cfg.name`, gradient
    checkpointing off (`keep_reference`: see `apply_lora`). `sampled_len` (GRPO: the longest
    sample) makes it a policy compared with a sampler: a rotary embedding the trainer cannot
    reproduce is refused before the weights load (`rlvr.model.rope`), and dropout is off."""
    path = _resolve_path(model_cfg, accelerator, sampled_len)
    tokenizer = load_tokenizer(path)
    pad = tokenizer.pad_token_id
    deepspeed = _is_deepspeed(accelerator)
    check_quantized_launch(model_cfg.quantization, accelerator.device, deepspeed)
    compute_dtype = master_weights_dtype(model_cfg, lora_cfg.enabled, deepspeed)
    model = load_model(
        path,
        model_cfg,
        dtype=torch.float32 if compute_dtype else None,
        device=accelerator.device,
    )
    tokenizer, reasoning_vocab = attach_reasoning_vocab(model, tokenizer, model_cfg, path)
    if compute_dtype is not None:  # after any resize: it replaces the head module
        mixed_precision(model, compute_dtype, accelerator.device.type)
    model = _trainable(model, lora_cfg, keep_reference, reasoning_vocab, sampled_len)
    pad_id = pad if pad is not None else tokenizer.eos_token_id
    hooks = policy_hooks(reasoning_vocab, tokenizer)
    return Policy(model, tokenizer, pad_id, path, reasoning_vocab, compute_dtype, hooks)


def _resolve_path(model_cfg: ModelConfig, accelerator: Any, sampled_len: int | None) -> str:
    """The model's weights directory or hub id, its rotary embedding checked for `sampled_len`."""
    from transformers import AutoConfig

    from rlvr.model.names import resolve_model
    from rlvr.model.rope import check_trainer_rope

    with accelerator.main_process_first():  # the embedded model is converted once, by one process
        path = resolve_model(model_cfg.name)
    if sampled_len is not None:
        check_trainer_rope(AutoConfig.from_pretrained(path), model_cfg.name, sampled_len)
    return path


def _is_deepspeed(accelerator: Any) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _trainable(
    model: torch.nn.Module,
    lora_cfg: LoraConfig,
    keep_reference: bool,
    reasoning_vocab: ReasoningVocab | None,
    sampled_len: int | None,
) -> torch.nn.Module:
    """`model` ready to train: no KV cache, LoRA when enabled, dropout off for a sampled policy."""
    model.config.use_cache = False
    if lora_cfg.enabled:
        model = apply_lora(model, lora_cfg, keep_reference, reasoning_vocab)
    if sampled_len is not None:
        disable_dropout(model, lora_cfg.dropout if lora_cfg.enabled else 0.0)
    return model


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in backward instead of keeping them."""
    model.gradient_checkpointing_enable({"use_reentrant": False})


def describe_policy(
    policy: Policy, model_cfg: ModelConfig, lora_cfg: LoraConfig, checkpointing: bool
) -> str:
    """The start-up line that names the loaded policy: its size, what trains and how."""
    model = policy.model
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    kind = "LoRA" if lora_cfg.enabled else "full"
    if model_cfg.quantization != "none":
        kind += f" on a {model_cfg.quantization} base"
    compute, vocab = policy.compute_dtype, policy.reasoning_vocab
    return (
        f"model {policy.path}: {num_parameters(model) / 1e6:.1f}M parameters, "
        f"{trainable / 1e6:.2f}M trainable ({kind}), dtype {model.dtype}"
        + (f" computing in {compute}" if compute else "")
        + f", gradient checkpointing {checkpointing}"
        + (f", reasoning vocabulary {vocab.size}" if vocab else "")
    )


def check_quantized_launch(quantization: str, device: torch.device, deepspeed: bool) -> None:
    """Refuse a quantized base where it cannot load: a device bitsandbytes has no kernels for,
    or DeepSpeed, whose ZeRO-3 partitions parameters it cannot shard (packed 4-bit bytes,
    int8 rows with their scales held beside them)."""
    from rlvr.model.quantization import check_device

    check_device(quantization, device)
    if quantization != "none" and deepspeed:
        raise ConfigError(
            f"model.quantization={quantization!r} is not supported under DeepSpeed (ZeRO-3 "
            "cannot partition quantized weights): launch without it (one process, or DDP)"
        )


def disable_dropout(model: torch.nn.Module, lora_dropout: float = 0.0) -> None:
    """Turn every dropout of `model` off: its dropout modules (LoRA's included) and the rates
    its modules and config keep as numbers; a `lora_dropout` > 0 is warned about. The loss
    and reference forwards run in train mode (`model.eval()` would also switch off gradient
    checkpointing), where a dropout would perturb every importance ratio."""
    if lora_dropout > 0:
        log.warning(
            "lora.dropout=%g is ignored in GRPO: the loss forward runs without dropout, since a "
            "dropout there would perturb every importance ratio and the reference pass",
            lora_dropout,
        )
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if _is_dropout_rate(name, value):
                setattr(module, name, 0.0)
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            for name, value in config.to_dict().items():
                if _is_dropout_rate(name, value):
                    setattr(config, name, 0.0)


def _is_dropout_rate(name: str, value: Any) -> bool:
    """A number named like a dropout rate (`attention_dropout`, `hidden_dropout_prob`,
    `resid_pdrop`, ...), not a flag."""
    named = "dropout" in name or name.endswith("_pdrop")
    return named and isinstance(value, float) and value > 0


def save_final(
    accelerator: Any,
    model: Any,
    tokenizer: Any,
    out_dir: Path,
    lora: bool,
    reasoning_vocab: ReasoningVocab | None = None,
) -> Path:
    """The trained adapter (LoRA) or full model in Hugging Face format, with the tokenizer (and
    the reasoning vocabulary's mapping), in `out_dir/final` (written atomically). ZeRO-3
    gathers only the adapter for LoRA. Every process must call this; the main one writes."""
    unwrapped = accelerator.unwrap_model(model)
    state = trainable_state(unwrapped) if lora else accelerator.get_state_dict(model)
    final = Path(out_dir) / "final"
    if accelerator.is_main_process:
        with atomic_directory(final, replace=True) as tmp:
            if lora:
                save_adapter(unwrapped, state, tmp)
            else:
                unwrapped.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            if reasoning_vocab is not None:
                reasoning_vocab.save(tmp)
    accelerator.wait_for_everyone()
    return final


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the trainable parameters (a LoRA policy: the adapter). Under ZeRO-3 only
    these are gathered, on every rank together; the frozen base stays partitioned."""
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    with zero3_gather(list(trainable.values())):
        return {n: p.detach().to("cpu", copy=True) for n, p in trainable.items()}


def save_adapter(model: torch.nn.Module, state: dict[str, torch.Tensor], directory: Path) -> None:
    """The trained adapter (`trainable_state`) in PEFT format: adapter_config.json +
    adapter_model.safetensors, as vLLM's `--lora-modules` and `load_lora_adapter` read it.
    Only the trained adapter, never the frozen KL reference copy. An adapter with a reasoning
    vocabulary holds the rows it trained, not whole embedding matrices: loading expands the
    base again (PEFT would otherwise save both in full)."""
    rows = getattr(model.peft_config["default"], "trainable_token_indices", None)
    extra = {"save_embedding_layers": False} if rows else {}
    model.save_pretrained(
        directory, state_dict=state, safe_serialization=True, selected_adapters=["default"], **extra
    )
    quantization = quantization_of(model)
    if quantization != "none":
        dtype = str(quantized_from(model)).removeprefix("torch.")
        (Path(directory) / BASE_QUANTIZATION_FILE).write_text(
            json.dumps({"quantization": quantization, "dtype": dtype})
        )


BASE_QUANTIZATION_FILE = "base_quantization.json"
"""Beside an adapter trained on a quantized base: which quantization, and the dtype the base's
weights were quantized from (`rlvr-merge-adapter` and `push_merged_adapter` read it to rebuild
the base the adapter was trained on)."""
