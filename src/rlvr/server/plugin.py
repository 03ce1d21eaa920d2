"""Registers rlvr's additions in every vLLM process, before the model loads.

It is vLLM's general plugin (entry point group `vllm.general_plugins`), so our `cpu`
weight-transfer engine exists on CPU workers, the reasoning-vocabulary tokenizer mode is known
(`rlvr.reasoning_vocab.vllm`), the CPU-only idle-spin cap below is in place in the worker, the
CPU's linear kernels record what they were built from (`rlvr.server.held_weights`), its LoRA
logits path takes prompt log-probability rows (`rlvr.server.lora_logits`), and its LoRA matmuls
run once per adapter, not once per token (`rlvr.server.cpu_lora_ops`)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.rlvr_plugin")

IDLE_SPIN_ENV = "RLVR_VLLM_IDLE_SPIN_S"
# How vLLM is told to serve a model with a reasoning vocabulary (see rlvr.reasoning_vocab.vllm)
REASONING_VOCAB_TOKENIZER_MODE = "rlvr_reasoning_vocab"
REASONING_VOCAB_PROCESSOR = "rlvr.reasoning_vocab.vllm:ReasoningVocabLogitsProcessor"
DEFAULT_CPU_IDLE_SPIN_S = 0.005


def register() -> None:
    """Register our weight-transfer engines and tokenizer mode; on a CPU cap idle spinning,
    fingerprint what each linear kernel is built from and let LoRA score prompts."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from rlvr.server import cpu_engine

    for factory, engine in (
        (WeightTransferEngineFactory, cpu_engine.CPUWeightTransferEngine),
        (WeightTransferTrainerFactory, cpu_engine.CPUTrainerWeightTransferEngine),
    ):
        try:
            factory.register_engine(cpu_engine.BACKEND, engine)
        except ValueError:  # already registered: plugins can load more than once per process
            pass

    register_reasoning_vocab_tokenizer()

    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        cap_idle_spin(float(os.environ.get(IDLE_SPIN_ENV, DEFAULT_CPU_IDLE_SPIN_S)))
        from rlvr.server.cpu_lora_ops import patch_cpu_lora_ops
        from rlvr.server.held_weights import patch_cpu_gemm_dispatch
        from rlvr.server.lora_logits import patch_cpu_lora_logits

        patch_cpu_gemm_dispatch()
        patch_cpu_lora_logits()
        patch_cpu_lora_ops()


def register_reasoning_vocab_tokenizer() -> None:
    """`--tokenizer-mode rlvr_reasoning_vocab`: the tokenizer of `rlvr.reasoning_vocab.vllm`
    (imported only when a server asks for it) with vLLM's own `hf` renderer."""
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    mode = REASONING_VOCAB_TOKENIZER_MODE
    if mode not in TokenizerRegistry.tokenizers:
        TokenizerRegistry.register(mode, "rlvr.reasoning_vocab.vllm", "ReasoningVocabTokenizer")
    if mode not in RENDERER_REGISTRY.renderers:
        RENDERER_REGISTRY.register(mode, "vllm.renderers.hf", "HfRenderer")


def cap_idle_spin(limit_s: float) -> None:
    """Limit how long a vLLM worker busy-waits (sched_yield) for its next message: vLLM spins
    a full second, which on a CPU host takes a core from the trainer's weight packing
    (docs/weight-transfer.md#weight-transfer-engine); a few milliseconds are plenty."""
    from vllm.distributed.device_communicators import shm_broadcast

    spin = getattr(shm_broadcast, "SpinCondition", None)
    if spin is None or not hasattr(spin, "wait"):
        log.warning("this vLLM has no SpinCondition.wait; the idle-spin cap is not applied")
        return
    original = getattr(spin.wait, "rlvr_original", spin.wait)

    def wait(self, timeout_ms: int | None = None) -> None:
        self.busy_loop_s = min(self.busy_loop_s, limit_s)
        original(self, timeout_ms)

    wait.rlvr_original = original
    spin.wait = wait
