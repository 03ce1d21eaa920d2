"""Shared-prefix training (rlvr.trainer.prefix_tree): folding a step's samples into prefix trees
changes no log-probability, loss term or gradient, keeps every continuation blind to the others, and
keeps groups whole across ranks."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from accelerate import Accelerator

from rlvr.config import load_config
from rlvr.model.policy import load_policy, reference_mode
from rlvr.reasoning_vocab.gate import ThinkGate
from rlvr.trainer.logprobs import sequence_scores
from rlvr.trainer.micro_batches import Sample

ATOL = 1e-5


def rollout(prompt: list[int], turns: list[tuple[list[int], bool]], g: torch.Generator) -> Sample:
    """A sample of `prompt` then `turns` (ids, sampled by the policy?), with made-up sampler
    log-probabilities on the sampled tokens (ratios away from 1) and a random advantage."""
    ids, mask = list(prompt), [0] * len(prompt)
    for tokens, sampled in turns:
        ids += tokens
        mask += [int(sampled)] * len(tokens)
    logprobs = [-float(torch.rand(1, generator=g)) * 4 * m for m in mask]
    return Sample(ids, mask, logprobs, float(torch.randn(1, generator=g)))


def step_samples(encode) -> list[Sample]:
    """Two single-turn groups of different prompt lengths (the long one opens a think span
    that its completions continue), and a multi-turn group whose first rollout split into two
    samples that share the prompt and the first turn."""
    g = torch.Generator().manual_seed(0)
    system = "You are a careful assistant: reason inside think tags, then answer briefly. "
    long_prompt = encode(system + "Question: what is two and two? Think first. <think>")
    short_prompt = encode(system + "Q: 3+4? <think>")
    answers = [" two and two make four </think> 4", " so </think> The answer is 4", " four",
               " hmm, five? no </think> four"]  # fmt: skip
    samples = [rollout(long_prompt, [(encode(a), True)], g) for a in answers]
    samples += [rollout(short_prompt, [(encode(a), True)], g) for a in answers[:3]]
    game = encode("You play tic-tac-toe against an opponent on a 3x3 board. Your move:")
    first, env, later = encode(" X at 5"), encode(" O at 1. Your move:"), encode(" X at 9")
    samples += [
        rollout(game, [(first, True), (env, False), (later, True)], g),
        # the same rollout's next turn, re-rendered: shares the prompt and the first turn
        rollout(game, [(first, True), (encode(" O at one. Move:"), False), (later, True)], g),
        rollout(game, [(encode(" X at 1"), True), (env, False)], g),
    ]
    return samples


@pytest.fixture(scope="module")
def samples(tiny_model_dir) -> list[Sample]:
    from rlvr.reasoning_vocab.mapping import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    return step_samples(lambda text: tokenizer.encode(text, add_special_tokens=False))


def policy(model_dir, lora: bool, checkpointing: bool, attention: str = "sdpa", device="cpu"):
    """The trainer's policy (expanded with a reasoning vocabulary, so the gate applies) in
    float32 on `device` with `attention`, its reference scorer and its gate. The policy is
    moved off its initial weights so that the KL to the reference is not zero."""
    cfg = load_config(overrides=[
        f"model.name={model_dir}", "model.dtype=float32", "model.reasoning_vocab_size=-1",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
        f"model.attn_implementation={attention}",
        f"lora.enabled={str(lora).lower()}", "lora.target_modules=[q_proj,v_proj,up_proj]",
        "loss.beta=0.1", "loss.clip_low=0.2", "loss.clip_high=0.3", "sampling.temperature=0.8",
        "batch.micro_batch_size=4",
    ])  # fmt: skip
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=device == "cpu")
    loaded = load_policy(cfg.model, cfg.lora, accelerator, keep_reference=True)
    model = loaded.model.to(device)
    frozen = None
    if not lora:
        frozen = load_policy(cfg.model, cfg.lora, accelerator).model.eval().to(device)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.02)

    def reference(mb, mask_logits):
        context = reference_mode(model) if lora else contextlib.nullcontext()
        with torch.no_grad(), context:
            scorer = model if lora else frozen
            return sequence_scores(scorer, mb, 0.8, mask_logits=mask_logits).logprobs

    gate = ThinkGate.from_tokenizer(loaded.reasoning_vocab, loaded.tokenizer)
    return model, cfg, reference, gate, loaded.pad_id


@pytest.mark.integration
@pytest.mark.slow
def test_prefix_sharing_zero3_two_ranks_pushes_the_unshared_runs_weights(tiny_server, tmp_path):
    """`accelerate launch` with ZeRO-3 on 2 CPU processes, prefix sharing on and off from the
    same initial weights and seeded rollouts: after 2 steps the adapter the trainer pushed
    (its final adapter) is the same, while the shared run forwarded far fewer tokens. "The
    same": Adam's first updates are about lr * sign(gradient), so where a gradient is near 0
    float32's rounding of differently ordered sums moves a handful of elements by up to
    ~1e-4 (of updates of ~0.03); all others agree to 1e-5."""
    from safetensors.torch import load_file
    from support import ZERO3_CPU, launch

    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config-file",
                  str(ZERO3_CPU), "--num-processes", "2"]  # fmt: skip
    adapters, saved = [], []
    for sharing in (True, False):
        out = tmp_path / f"sharing-{sharing}"
        extra = ["max_steps=2", "batch.micro_batch_size=4", f"batch.prefix_sharing={sharing}"]
        ranks = launch(tiny_server, out, accelerate, extra, {"DS_ACCELERATOR": "cpu"})
        assert [r["world"] for r in ranks] == [2, 2]
        saved.append([h["throughput/prefix_saved_frac"] for h in ranks[0]["history"]])
        adapters.append(load_file(out / "run" / "final" / "adapter_model.safetensors"))
    assert min(saved[0]) > 0.3 and max(saved[1]) == 0
    shared, unshared = adapters
    assert shared.keys() == unshared.keys()
    differ = 0
    for name, weight in unshared.items():
        assert torch.allclose(shared[name], weight, atol=1e-4), name
        differ += int(((shared[name] - weight).abs() > ATOL).sum())
    assert differ <= 1e-3 * sum(w.numel() for w in unshared.values())
    assert any(w.abs().max() > 0 for name, w in unshared.items() if "lora_B" in name)
