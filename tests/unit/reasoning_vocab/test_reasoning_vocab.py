"""The reasoning vocabulary without a server: expansion after load, the mapping on disk, the
expanded tokenizer, the think-span rule and the logits the trainer computes with it."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from tokenizers.decoders import DecodeStream
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from rlvr.batch import Sample
from rlvr.config import ConfigError, LoraConfig, ModelConfig, load_config
from rlvr.layout.micro_batches import collate
from rlvr.model.merge import merge_adapter
from rlvr.model.policy import load_policy, save_final
from rlvr.reasoning_vocab.expand import expand_checkpoint
from rlvr.reasoning_vocab.gate import ThinkGate, ThinkTracker
from rlvr.reasoning_vocab.mapping import (
    MARKER,
    ReasoningVocab,
    attach,
    copyable_ids,
    load_tokenizer,
    with_trained_rows,
)
from rlvr.trainer.logprobs import sequence_scores

TEXT = "Solve 2+2. <think> two and two make four, so </think> The answer is \\boxed{4}."


def load_tiny(model_dir: Path, tie: bool = False):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if tie:  # the same shapes with one matrix for embedding and head
        torch.manual_seed(1)
        model.config.tie_word_embeddings = True
        model = Qwen2ForCausalLM(model.config).float()
    return model, load_tokenizer(model_dir)


def expanded(model_dir: Path, size: int = -1, tie: bool = False):
    model, tokenizer = load_tiny(model_dir, tie)
    cfg = ModelConfig(reasoning_vocab_size=size)
    tokenizer, vocab = attach(model, tokenizer, cfg, str(model_dir))
    return model, tokenizer, vocab


def with_copies(vocab: ReasoningVocab, ids: list[int]) -> list[int]:
    """`ids` with every copied token spelled as its reasoning copy."""
    copy_of = {original: vocab.base_vocab_size + j for j, original in enumerate(vocab.original_ids)}
    return [copy_of.get(i, i) for i in ids]


# ---- expansion --------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_reasoning_vocab_expansion_keeps_originals_and_copies_rows(tiny_model_dir, tie):
    before, _ = load_tiny(tiny_model_dir, tie)
    state = {k: v.clone() for k, v in before.state_dict().items()}
    model, _, vocab = expanded(tiny_model_dir, 100, tie)
    v, n = vocab.base_vocab_size, vocab.size
    assert (v, n) == (state["model.embed_tokens.weight"].shape[0], 100)
    source = torch.tensor(vocab.original_ids)
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert (head is embedding) == tie
    assert model.config.vocab_size == embedding.shape[0] == head.shape[0] == v + n
    for name, weight in (("model.embed_tokens.weight", embedding), ("lm_head.weight", head)):
        original = state[name]
        assert torch.equal(weight[:v], original)  # bit-identical
        assert torch.equal(weight[v:], original[source])
    after = model.state_dict()
    for name, tensor in state.items():
        if name not in ("model.embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(after[name], tensor), name


def test_reasoning_vocab_never_copies_special_tokens(tiny_model_dir):
    model, tokenizer = load_tiny(tiny_model_dir)
    rows = model.get_input_embeddings().weight.shape[0]
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")} <= special
    candidates = copyable_ids(tokenizer, rows)
    assert not special & set(candidates)
    assert len(candidates) == rows - len(special)
    _, _, everything = expanded(tiny_model_dir, -1)
    assert everything.original_ids == tuple(candidates)
    _, _, first = expanded(tiny_model_dir, 10)
    assert first.original_ids == tuple(candidates[:10])  # the first N non-special ids
    with pytest.raises(ConfigError, match="non-special tokens"):
        expanded(tiny_model_dir, len(candidates) + 1)
    with pytest.raises(ConfigError, match="reasoning_vocab_size"):
        load_config(overrides=["model.reasoning_vocab_size=-2"])
    with pytest.raises(ConfigError, match="reasoning_start/end"):
        load_config(overrides=["model.reasoning_start=<think>", "model.reasoning_end=<think>x"])


def test_reasoning_vocab_of_the_embedded_model_skips_its_special_tokens():
    from rlvr.model.names import ensure_embedded_model

    tokenizer = load_tokenizer(ensure_embedded_model())
    candidates = copyable_ids(tokenizer, 49152)
    assert len(candidates) == 49152 - 17  # <|endoftext|>, <|im_start|>, <|im_end|>, ...
    assert min(candidates) == 17 and tokenizer.eos_token_id not in candidates


def test_reasoning_vocab_ids_start_at_the_embedding_size_not_the_tokenizer_size(tiny_model_dir):
    """Qwen pads its embedding beyond its tokenizer: reasoning ids start after the padding."""
    model, tokenizer = load_tiny(tiny_model_dir)
    rows = len(tokenizer) + 30
    model.resize_token_embeddings(rows, mean_resizing=False)
    cfg = ModelConfig(reasoning_vocab_size=-1)
    tokenizer, vocab = attach(model, tokenizer, cfg, str(tiny_model_dir))
    assert vocab.base_vocab_size == rows and max(vocab.original_ids) < rows - 30
    probe = [vocab.base_vocab_size, vocab.total_vocab_size - 1]
    assert tokenizer.decode(probe) == tokenizer.decode(vocab.fold(probe))


# ---- the tokenizer ----------------------------------------------------------------------


def test_reasoning_vocab_tokenizer_decodes_copies_as_originals(tiny_model_dir):
    _, original = load_tiny(tiny_model_dir)
    _, tokenizer, vocab = expanded(tiny_model_dir)
    ids = original.encode(TEXT)
    assert tokenizer.encode(TEXT) == ids  # encoding is unchanged
    assert tokenizer.encode(MARKER + TEXT) == original.encode(MARKER + TEXT)
    copied = with_copies(vocab, ids)
    assert sum(i >= vocab.base_vocab_size for i in copied) > 10
    assert tokenizer.decode(copied) == original.decode(ids) == TEXT
    stream, text = DecodeStream(skip_special_tokens=True), ""
    for token in copied:  # vLLM's incremental detokenizer path (the Rust tokenizer)
        text += stream.step(tokenizer.backend_tokenizer, token) or ""
    assert text == TEXT


# ---- saving and loading -----------------------------------------------------------------


def test_reasoning_vocab_survives_save_and_load(tiny_model_dir, tmp_path):
    out = expand_checkpoint(
        ModelConfig(name=str(tiny_model_dir), reasoning_vocab_size=50), tmp_path / "rv"
    )
    vocab = ReasoningVocab.load(out)
    assert vocab is not None and vocab.size == 50
    accelerator = Accelerator(cpu=True)
    off = LoraConfig(enabled=False)
    policy = load_policy(ModelConfig(name=str(out)), off, accelerator)  # size 0: restored
    assert policy.reasoning_vocab == vocab
    probe = [vocab.base_vocab_size, vocab.total_vocab_size - 1]
    assert policy.tokenizer.decode(probe) == policy.tokenizer.decode(vocab.fold(probe))
    assert load_policy(ModelConfig(name=str(out), reasoning_vocab_size=50), off, accelerator)
    with pytest.raises(ConfigError, match="already carries"):
        load_policy(ModelConfig(name=str(out), reasoning_vocab_size=20), off, accelerator)

    final = save_final(accelerator, policy.model, policy.tokenizer, tmp_path, False, vocab)
    assert ReasoningVocab.load(final) == vocab
    again = load_policy(ModelConfig(name=str(final)), off, accelerator)
    assert again.reasoning_vocab == vocab
    assert torch.equal(again.model.lm_head.weight, policy.model.lm_head.weight)


def test_reasoning_vocab_lora_trains_only_the_new_rows_and_merges(tiny_model_dir, tmp_path):
    accelerator = Accelerator(cpu=True)
    cfg = ModelConfig(name=str(tiny_model_dir), reasoning_vocab_size=40)
    policy = load_policy(cfg, LoraConfig(rank=4, target_modules=["q_proj"]), accelerator)
    vocab = policy.reasoning_vocab
    trainable = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    rows = [p for n, p in trainable.items() if "trainable_tokens_delta" in n]
    assert len(rows) == 2 and all(p.shape[0] == 40 for p in rows)  # embedding and untied head
    with torch.no_grad():  # pretend training moved the reasoning rows
        for p in rows:
            p.add_(torch.randn_like(p))
    base = policy.model.get_base_model()
    live = {
        name: with_trained_rows(module.token_adapter).detach().clone()
        for name, module in (("embed", base.model.embed_tokens), ("head", base.lm_head))
    }
    final = save_final(accelerator, policy.model, policy.tokenizer, tmp_path, True, vocab)
    assert ReasoningVocab.load(final) == vocab
    merged_dir = merge_adapter(final, tmp_path / "merged")
    assert ReasoningVocab.load(merged_dir) == vocab
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    assert torch.allclose(merged.model.embed_tokens.weight, live["embed"])
    assert torch.allclose(merged.lm_head.weight, live["head"])
    original, _ = load_tiny(tiny_model_dir)
    v = vocab.base_vocab_size
    assert torch.equal(merged.model.embed_tokens.weight[:v], original.model.embed_tokens.weight)


def test_reasoning_vocab_lora_pushes_merged_weights_not_the_adapter(tiny_model_dir, tmp_path):
    """vLLM's LoRA cannot serve the trained reasoning rows: `auto` falls back to merged pushes
    and says why, `adapter` is refused, even on a server that loads adapters (rank 16)."""
    from rlvr.weight_sync.adapter import adapter_sync_problem
    from rlvr.weight_sync.connect import choose_push

    lora = LoraConfig(rank=4, target_modules=["q_proj"])
    cfg = ModelConfig(name=str(tiny_model_dir), reasoning_vocab_size=40)
    policy = load_policy(cfg, lora, Accelerator(cpu=True))
    assert "reasoning vocabulary" in adapter_sync_problem(policy.model, 16)
    plain = load_policy(ModelConfig(name=str(tiny_model_dir)), lora, Accelerator(cpu=True))
    assert adapter_sync_problem(plain.model, 16) is None  # the same adapter without the rows

    printed = []
    server = SimpleNamespace(control=SimpleNamespace(max_lora_rank=lambda: 16), resolve=lambda: "x")
    cfg = load_config(overrides=[f"output_dir={tmp_path}", "server.lora_sync=auto"])
    assert choose_push(server, cfg, policy.model, None, printed.append) == "x"  # merged transfer
    assert "reasoning vocabulary" in printed[0] and "merged" in printed[0]
    cfg = load_config(overrides=[f"output_dir={tmp_path}", "server.lora_sync=adapter"])
    with pytest.raises(ConfigError, match="lora_sync=adapter: .*reasoning vocabulary"):
        choose_push(server, cfg, policy.model, None, printed.append)


@pytest.mark.parametrize("policy_has_it", [True, False], ids=["policy", "server"])
def test_reasoning_vocab_on_one_side_only_is_refused(tiny_model_dir, tmp_path, policy_has_it):
    """A policy with copies against a server without them (its pushes could not land, its
    samples would never think in them), or the reverse, fails before the first push."""
    from rlvr.server.plugin import REASONING_VOCAB_TOKENIZER_MODE
    from rlvr.weight_sync.connect import check_served_vocabulary

    cfg = load_config(overrides=[f"output_dir={tmp_path}"])
    vocab = ReasoningVocab(100, (1, 2, 3)) if policy_has_it else None
    served = SimpleNamespace(tokenizer_mode=lambda: REASONING_VOCAB_TOKENIZER_MODE)
    plain = SimpleNamespace(tokenizer_mode=lambda: "auto")
    silent = SimpleNamespace(tokenizer_mode=lambda: None)
    good, bad = (served, plain) if policy_has_it else (plain, served)
    check_served_vocabulary(good, vocab, cfg)
    check_served_vocabulary(silent, vocab, cfg)
    match = "expand_vocab.py" if policy_has_it else "train the directory it serves"
    with pytest.raises(ConfigError, match=match):
        check_served_vocabulary(bad, vocab, cfg)


# ---- the think-span rule ----------------------------------------------------------------


def toy_gate() -> ThinkGate:
    """Token texts chosen so delimiters come in several spellings; ids 9.. are copies."""
    pieces = ["<think>", "</think>", "<th", "ink>", "</", "a", " b", "<", "EOS", "think>"]
    vocab = ReasoningVocab(len(pieces), original_ids=(2, 3, 4, 5, 6, 7, 9))  # not 0, 1, 8
    return ThinkGate(vocab, pieces)


def test_reasoning_vocab_think_span_rule():
    gate = toy_gate()
    # position i answers: may token i+1 be a reasoning id?
    assert gate.inside([5, 0, 5, 1, 5]) == [False, True, True, False, False]
    assert gate.inside([2, 3, 5, 4, 9, 5]) == [False, True, True, True, False, False]
    # delimiters spelled with reasoning copies (10 = "<th", 11 = "ink>", ...) count too
    assert gate.inside([10, 11, 13, 12, 16, 5]) == [False, True, True, True, False, False]
    # "<" + "/" ... across tokens, and a closing tag that never opened changes nothing
    assert gate.inside([1, 5, 7, 0]) == [False, False, False, True]
    tracker = ThinkTracker("<think>", "</think>")
    assert tracker.peek("<think>") and not tracker.inside
    assert tracker.feed("x<think>y") and not tracker.feed("</think>")
    # a delimiter split over short pieces while less text than it has been seen
    tracker = ThinkTracker("<think>", "</think>", inside=True)
    assert [tracker.feed(p) for p in ["a", " b", " </", "think", ">"]] == [True] * 4 + [False]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reasoning_vocab_gate_and_fold_logits(temperature):
    gate = toy_gate()
    vocab = gate.vocab
    logits = torch.randn(2, vocab.total_vocab_size)
    logits[:, vocab.base_vocab_size :] = logits[:, list(vocab.original_ids)]  # as expanded
    inside = torch.tensor([False, True])
    p = torch.softmax(gate.gate_logits(logits / temperature, inside), -1)
    original = torch.softmax(logits[:, : vocab.base_vocab_size] / temperature, -1)
    assert p[0, vocab.base_vocab_size :].sum() == 0  # outside: no reasoning ids
    assert torch.allclose(p[0, : vocab.base_vocab_size], original[0])
    copies = p[1, vocab.base_vocab_size :]
    originals = p[1, list(vocab.original_ids)]
    assert torch.allclose(copies, originals) and copies.sum() > 0  # inside: an even split
    folded = torch.softmax(gate.fold_logits(logits / temperature, inside), -1)
    assert torch.allclose(folded[:, : vocab.base_vocab_size], original, atol=1e-6)
    # the sampler's form: raw logits in place, before its own division by the temperature
    raw = logits.clone()
    gate.gate_logits_(raw, inside, torch.full((2,), temperature))
    assert torch.allclose(torch.softmax(raw / temperature, -1), p, atol=1e-6)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_reasoning_vocab_expansion_alone_changes_no_distribution(tiny_model_dir, tie):
    """The expanded model, gated and with reasoning ids folded onto their originals, gives
    the original model's next-token distribution at every position, inside think spans and
    outside, also when the context itself holds reasoning ids."""
    original, tokenizer = load_tiny(tiny_model_dir, tie)
    model, tokenizer, vocab = expanded(tiny_model_dir, -1, tie)
    gate = ThinkGate.from_tokenizer(vocab, tokenizer)
    ids = tokenizer.encode(TEXT)
    inside = gate.inside(ids)
    assert any(inside) and not all(inside)
    copies = with_copies(vocab, ids)
    spelled = [copies[i] if i and inside[i - 1] else t for i, t in enumerate(ids)]
    assert any(t >= vocab.base_vocab_size for t in spelled)
    assert gate.inside(spelled) == inside
    temperature = 0.8
    with torch.no_grad():
        reference = original(torch.tensor([ids])).logits[0] / temperature
        logits = model(torch.tensor([spelled])).logits[0] / temperature
    folded = gate.fold_logits(logits, torch.tensor(inside))
    assert torch.allclose(
        folded.log_softmax(-1)[:, : vocab.base_vocab_size], reference.log_softmax(-1), atol=1e-5
    )


def test_reasoning_vocab_mask_hook_gates_each_packed_sample_from_its_start(tiny_model_dir):
    """`logit_mask` (the trainer's hook into the chunked log-probabilities) gives each token
    the log-probability of the gated distribution, with every packed sample's span state
    starting afresh: the importance ratio then compares like with like."""
    model, tokenizer, vocab = expanded(tiny_model_dir, -1)
    gate = ThinkGate.from_tokenizer(vocab, tokenizer)
    opened = tokenizer.encode("Q <think> a b a b")
    samples = []
    for ids in (opened + with_copies(vocab, tokenizer.encode(" b a")), tokenizer.encode("a b a")):
        samples.append(Sample(ids, [0] * 3 + [1] * (len(ids) - 3), [0.0] * len(ids)))
    mb = collate([samples], tokenizer.pad_token_id)  # one packed row
    assert mb.position_ids is not None
    temperature = 0.9
    with torch.no_grad():
        scores = sequence_scores(model, mb, temperature, mask_logits=gate.logit_mask(mb))
    for s, start in ((samples[0], 0), (samples[1], len(samples[0]))):
        with torch.no_grad():
            logits = model(torch.tensor([s.input_ids])).logits[0, :-1] / temperature
        gated = gate.gate_logits(logits, torch.tensor(gate.inside(s.input_ids)[:-1]))
        expected = gated.log_softmax(-1).gather(-1, torch.tensor(s.input_ids[1:])[:, None])[:, 0]
        got = scores.logprobs[0, start : start + len(s) - 1]
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        assert torch.allclose(got[mask], expected[mask], atol=1e-5)
        assert torch.isfinite(got[mask]).all()
    thinking = [
        t
        for s in samples
        for i, t in enumerate(s.input_ids[1:])
        if s.loss_mask[i + 1] and gate.inside(s.input_ids)[i]
    ]
    reasoning = sum(t >= vocab.base_vocab_size for t in thinking)
    assert 0 < reasoning < len(thinking)
    metrics = gate.rollout_metrics(samples)
    assert metrics["reasoning/reasoning_id_share"] == pytest.approx(reasoning / len(thinking))
    sampled = sum(s.num_loss_tokens for s in samples)
    assert metrics["reasoning/think_tokens"] == pytest.approx(len(thinking) / sampled)
    ids = tokenizer.encode("a b") + [vocab.base_vocab_size]
    outside = Sample(ids, [0] * (len(ids) - 1) + [1], [0.0] * len(ids))
    with pytest.raises(RuntimeError, match="outside think spans"):
        gate.rollout_metrics([outside])
    assert math.isfinite(float(scores.logprobs.sum()))
