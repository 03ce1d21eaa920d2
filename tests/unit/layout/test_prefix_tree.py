"""Shared-prefix training (rlvr.layout): folding a step's samples into prefix trees
changes no log-probability, loss term or gradient, keeps every continuation blind to the others, and
keeps groups whole across ranks."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from accelerate import Accelerator

from rlvr.batch import Sample
from rlvr.config import load_config
from rlvr.layout.attention import tree_attention
from rlvr.layout.folded import FoldedMicroBatch, collate_folded, visibility
from rlvr.layout.micro_batches import padding_micro_batch
from rlvr.layout.plan import MIN_SAVED_FRACTION, plan_micro_batches
from rlvr.layout.prefix_tree import (
    common_prefix,
    fold_rows,
    rank_folded_micro_batches,
    row_tree,
)
from rlvr.layout.tree_sdpa import NodePlan, tree_sdpa
from rlvr.layout.tree_sdpa import register as register_tree_sdpa
from rlvr.model.policy import enable_gradient_checkpointing, load_policy, reference_mode
from rlvr.reasoning_vocab.gate import ThinkGate
from rlvr.trainer.logprobs import sequence_scores
from rlvr.trainer.step import micro_batch_loss

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
    answers = [
        " two and two make four </think> 4",
        " so </think> The answer is 4",
        " four",
        " hmm, five? no </think> four",
    ]
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


def policy(
    model_dir,
    lora: bool,
    checkpointing: bool,
    attention: str = "sdpa",
    device="cpu",
    loss: tuple[str, ...] = (),
):
    """The trainer's policy (expanded with a reasoning vocabulary, so the gate applies) in
    float32 on `device` with `attention`, its reference scorer and its gate (`loss`: more
    `loss.*` overrides). The policy is moved off its initial weights so that the KL to the
    reference is not zero."""
    cfg = load_config(
        overrides=[
            f"model.name={model_dir}",
            "model.dtype=float32",
            "model.reasoning_vocab_size=-1",
            f"model.gradient_checkpointing={str(checkpointing).lower()}",
            f"model.attn_implementation={attention}",
            f"lora.enabled={str(lora).lower()}",
            "lora.target_modules=[q_proj,v_proj,up_proj]",
            "loss.beta=0.1",
            "loss.clip_low=0.2",
            "loss.clip_high=0.3",
            "sampling.temperature=0.8",
            # the made-up sampler log-probabilities put most ratios far from 1: keep them all in
            # the loss, so the gradients compared below are not zero
            "loss.ratio_mask_low=1e-9",
            "loss.ratio_mask_high=1e9",
            "batch.micro_batch_size=4",
            *loss,
        ]
    )
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=device == "cpu")
    loaded = load_policy(cfg.model, cfg.lora, accelerator, keep_reference=True)
    if checkpointing:
        enable_gradient_checkpointing(loaded.model)
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


def train_step(model, cfg, reference, gate, pad_id, samples, attention):
    """One step's loss, summed stats, gradients and per-sample log-probabilities, as the
    trainer's forward_backward computes them with the layout `attention` selects."""
    plan = plan_micro_batches(samples, 0, 1, cfg.batch, pad_id, attention)
    tokens = sum(s.num_loss_tokens for s in samples)
    model.train()
    model.zero_grad()
    totals: dict[str, float] = {}
    logprobs: dict[int, torch.Tensor] = {}
    for chunk in plan.micro_batches:
        mb = plan.layout.collate(chunk).to(next(model.parameters()).device)
        assert isinstance(mb, FoldedMicroBatch) == (attention is not None)
        mask = gate.logit_mask(mb)
        loss, terms = micro_batch_loss(
            model, mb, cfg, tokens, 1, lambda m, mask=mask: reference(m, mask), mask
        )
        loss.backward()
        for key, value in {**terms.stats, "tokens": terms.tokens, "loss": loss}.items():
            totals[key] = totals.get(key, 0.0) + float(value.detach())
        with torch.no_grad():
            scores = sequence_scores(model, mb, 0.8, mask_logits=mask).logprobs
        for i, s in enumerate(s for row in chunk for s in row):
            logprobs[id(s)] = scores[i, : len(s) - 1]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return totals, grads, logprobs, plan


@pytest.mark.parametrize(
    "lora, checkpointing",
    [(True, False), (False, False), (True, True)],
    ids=["lora", "full", "lora-checkpointing"],
)
def test_prefix_tree_loss_and_gradients_match_unshared(
    tiny_model_dir, samples, lora: bool, checkpointing: bool
):
    """float32: every token's log-probability, the loss, its KL-to-reference, entropy, ratio
    and mismatch sums, and every gradient agree with the unshared layout to 1e-5, with the
    reasoning gate on and groups of different prompt lengths sharing a micro-batch."""
    assert_fold_matches_unshared(policy(tiny_model_dir, lora, checkpointing), samples, "sdpa")


def test_prefix_tree_matches_unshared_with_per_sequence_losses(tiny_model_dir, samples):
    """The losses that reduce per sequence (GSPO's sequence ratio, the per-sequence mean)
    read each sample's positions from the folded layout as from the unshared one."""
    loss = ("loss.ratio_level=sequence", "loss.aggregation=seq_mean_token_mean")
    setup = policy(tiny_model_dir, True, False, loss=loss)
    assert_fold_matches_unshared(setup, samples, "sdpa")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for flex backward")
def test_prefix_tree_flex_attention_matches_unshared_on_gpu(tiny_model_dir, samples):
    """The GPU path: flex attention with the tree's block mask (no dense mask) gives the
    unshared layout's log-probabilities, loss terms and gradients."""
    setup = policy(tiny_model_dir, True, True, "flex_attention", "cuda")
    assert tree_attention(setup[0]) == "flex_attention"
    assert_fold_matches_unshared(setup, samples, "flex_attention")


def assert_fold_matches_unshared(setup, samples: list[Sample], attention: str) -> None:
    folded = train_step(*setup, samples, attention)
    unshared = train_step(*setup, samples, None)
    plan = folded[3]
    forwarded = sum(plan.layout.forwarded(mb) for mb in plan.micro_batches)
    assert forwarded < 0.6 * sum(len(s) for s in samples)
    long_prompt, short_prompt = samples[0], samples[4]  # both groups in one micro-batch
    assert any(
        {id(long_prompt), id(short_prompt)} <= {id(s) for row in mb for s in row}
        for mb in plan.micro_batches
    )
    assert_same_training(folded, unshared, samples)


def assert_same_training(folded, unshared, samples: list[Sample]) -> None:
    """Two `train_step` results agree: summed loss terms, every gradient and every token's
    log-probability, to `ATOL`."""
    sums = ("loss", "loss/total", "loss/kl_ref", "entropy", "ratio/mean", "mismatch_kl")
    for key in sums:
        # sums over ~200 tokens: float32's rounding of the sum, relative
        assert folded[0][key] == pytest.approx(unshared[0][key], rel=1e-6, abs=ATOL), key
    assert unshared[0]["loss/kl_ref"] > 1e-3  # the reference pass counts
    assert max(float(g.abs().max()) for g in unshared[1].values()) > 1e-4  # a loss that trains
    assert folded[1].keys() == unshared[1].keys()
    for name, grad in unshared[1].items():
        assert torch.allclose(folded[1][name], grad, atol=ATOL), name
    for s in samples:
        assert torch.allclose(folded[2][id(s)], unshared[2][id(s)], atol=ATOL)


def multi_turn_samples(encode) -> list[Sample]:
    """A tree three levels deep: a game rollout split into one sample per turn (each turn's
    sample a prefix of the next), rollouts branching from it after its first and its second
    turn; and a single-turn group of another prompt, whose row is narrower (padding)."""
    g = torch.Generator().manual_seed(1)
    game = encode("You play tic-tac-toe against an opponent on a 3x3 board. Your move:")
    moves = [encode(m) for m in (" X at 5", " X at 9", " X at 3")]
    replies = [encode(r) for r in (" O at 1. Your move:", " O at 7. Your move:")]
    turns = [(moves[0], True), (replies[0], False), (moves[1], True)]
    turns += [(replies[1], False), (moves[2], True)]
    samples = [rollout(game, turns[: 1 + 2 * t], g) for t in range(3)]
    samples.append(rollout(game, [*turns[:2], (encode(" X at 2"), True)], g))
    samples.append(rollout(game, [*turns[:4], (encode(" X at 1"), True)], g))
    question = encode("Q: 3+4? <think>")
    for answer in (" seven </think> 7", " 7", " hmm </think> eight"):
        samples.append(rollout(question, [(encode(answer), True)], g))
    return samples


def test_prefix_tree_deeper_multi_turn_trees_match_unshared(tiny_model_dir):
    """Deeper trees (a rollout's turns, each sample a prefix of the next), several trees per
    micro-batch and padded rows, full fine-tuning with gradient checkpointing: the node split
    gives the unshared layout's log-probabilities, loss terms and gradients to 1e-5."""
    from rlvr.reasoning_vocab.mapping import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    samples = multi_turn_samples(lambda t: tokenizer.encode(t, add_special_tokens=False))
    setup = policy(tiny_model_dir, False, True)
    folded = train_step(*setup, samples, "sdpa")
    plan = folded[3]
    assert any(len(mb) > 1 for mb in plan.micro_batches)  # several trees in one micro-batch
    mb = plan.layout.collate(next(mb for mb in plan.micro_batches if len(mb) > 1))
    assert mb.tree_plan.padding and max(len(b.ancestors) for b in mb.tree_plan.buckets) >= 2
    assert_same_training(folded, train_step(*setup, samples, None), samples)


def test_prefix_tree_nodes_attend_exactly_what_the_tree_allows():
    """On random trees of every shape (shared prompts, samples that are prefixes of others,
    duplicates, several rows of different widths), the node split scores each query against
    exactly the keys `k <= q < scope_end[k]` allows, padding against itself alone."""
    g = torch.Generator().manual_seed(5)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=g))

    for _ in range(20):
        sequences: list[list[int]] = []
        for _ in range(draw(2, 9)):  # each continues a prefix of an earlier one (or none)
            base = sequences[draw(0, len(sequences))] if sequences else []
            tail = torch.randint(3, 6, (draw(0, 6),), generator=g).tolist()  # few ids: deep trees
            sequences.append(base[: draw(0, len(base) + 1)] + tail or [3])
        samples = [Sample(ids, [0] * len(ids), [0.0] * len(ids)) for ids in sequences]
        rows = fold_rows(samples, 10_000) + fold_rows([Sample([9], [0], [0.0])], 10)
        mb = collate_folded(rows, 0, "sdpa")
        r, w = mb.scope_end.shape
        index = torch.arange(w)
        rule = visibility(mb.scope_end)(
            torch.arange(r)[:, None, None], None, index[None, :, None], index[None, None, :]
        )
        assert torch.equal(attended(mb.tree_plan, r, w), rule)


def test_tree_sdpa_without_a_plan_is_the_models_own_sdpa(tiny_model_dir):
    """Registered under "sdpa", the tree attention leaves every forward without a node plan
    (unshared micro-batches, generation, other models) to transformers' own sdpa: the same
    logits, bit for bit, with and without it registered."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    register_tree_sdpa()
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is tree_sdpa
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.randint(3, 400, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids).logits
        AttentionInterface.register("sdpa", sdpa_attention_forward)
        try:
            theirs = model(ids).logits
        finally:
            AttentionInterface.register("sdpa", tree_sdpa)
    assert torch.equal(ours, theirs)


def test_prefix_tree_folds_every_shared_prefix_once(samples):
    """Each distinct token prefix is placed once: the two single-turn groups share their
    system prompt, and the multi-turn rollout's two samples share their first turn as well as
    the prompt. Positions are the tokens' own in their samples."""
    first_turn, next_turn, other = samples[-3:]
    rows = fold_rows(samples, 10_000)
    assert len(rows) == 2  # the game's prompt shares too little with the others
    (game,) = (row for row in rows if first_turn in row)
    assert sorted(map(id, game)) == sorted(map(id, (first_turn, next_turn, other)))
    tree = row_tree(game)
    prefixes = {tuple(s.input_ids[: k + 1]) for s in game for k in range(len(s))}
    assert len(tree.ids) == len(prefixes)
    a, b = (tree.locations[game.index(s)] for s in (first_turn, next_turn))
    shared = common_prefix(first_turn.input_ids, next_turn.input_ids)
    assert shared > len(other.input_ids) // 2  # deeper than the prompt
    assert a[:shared] == b[:shared] and set(a[shared:]).isdisjoint(b[shared:])
    for s, placed in zip(game, tree.locations, strict=True):
        assert [tree.ids[k] for k in placed] == s.input_ids
        assert [tree.positions[k] for k in placed] == list(range(len(s)))


def test_prefix_tree_continuations_do_not_see_each_other(tiny_model_dir):
    """Rewriting one continuation changes no other continuation's log-probabilities, which
    equal their samples' forwards on their own; in what the node split scores no continuation
    token sees another continuation, every one sees the whole prompt, and the flex-attention
    rule gives the same mask."""
    from torch.nn.attention.flex_attention import create_mask
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 400, (12,), generator=g).tolist()
    tails = [torch.randint(3, 400, (n,), generator=g).tolist() for n in (5, 8, 3)]

    def folded(tails):
        row = sorted((rollout(prompt, [(t, True)], g) for t in tails), key=lambda s: s.input_ids)
        mb = collate_folded([row], 0, "sdpa")
        with torch.no_grad():
            got = sequence_scores(model, mb).logprobs
        return {tuple(s.input_ids): got[i, : len(s) - 1] for i, s in enumerate(row)}, mb, row

    before, mb, row = folded(tails)
    after, _, _ = folded([tails[0], [7, 8, 9, 10, 11, 12], tails[2]])
    for tail in (tails[0], tails[2]):
        ids = tuple(prompt + tail)
        assert torch.equal(before[ids], after[ids])
        with torch.no_grad():
            alone = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        expected = alone.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        sampled = slice(len(prompt) - 1, None)
        assert torch.allclose(before[ids][sampled], expected[sampled], atol=ATOL)
    mask = attended(mb.tree_plan, *mb.scope_end.shape)[:, None]
    tree = row_tree(row)
    own = [set(placed[len(prompt) :]) for placed in tree.locations]
    for i, queries in enumerate(own):
        for j, keys in enumerate(own):
            seen = mask[0, 0][sorted(queries)][:, sorted(keys)]
            assert seen.any() == (i == j)
        assert mask[0, 0][sorted(queries)][:, : len(prompt)].all()
    rows, width = mb.scope_end.shape
    flex = create_mask(visibility(mb.scope_end), rows, 1, width, width, device="cpu")
    assert torch.equal(flex, mask)


def attended(plan: NodePlan, rows: int, width: int) -> torch.Tensor:
    """[R, W, W] the keys each query of the folded rows is scored against under `plan`: a
    bucket's keys are its ancestors' tokens then each member's own, its mask (or causal, for
    roots) says which a query reads; a padding token reads itself. One row's query never
    meets another row's key (asserted)."""
    bounds = [0, *itertools.accumulate(plan.sizes)]
    tokens = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    seen = torch.zeros(rows * width, rows * width, dtype=torch.bool)
    for bucket in plan.buckets:
        ancestors = [k for a in bucket.ancestors for k in tokens[a]]
        for g, member in enumerate(bucket.members):
            own = tokens[member]
            for i, query in enumerate(own):
                if bucket.mask is None:
                    seen[query, own[: i + 1]] = True
                    continue
                keys = torch.tensor(ancestors + own)
                visible = bucket.mask[g, 0, i, : len(keys)]
                assert not bucket.mask[g, 0, i, len(keys) :].any()  # no padding key
                seen[query, keys[visible]] = True
    for node in plan.padding:
        seen[tokens[node], tokens[node]] = True
    blocks = seen.view(rows, width, rows, width)
    for r in range(rows):
        assert not blocks[r].any(dim=(0, 2))[[x for x in range(rows) if x != r]].any()
    return torch.stack([blocks[r, :, r] for r in range(rows)])


def test_prefix_tree_ranks_get_whole_trees_and_equal_micro_batch_counts(samples):
    rows = fold_rows(samples, 10_000)
    assert len(rows) == 2
    shares = [rank_folded_micro_batches(rows, r, 3, 1000, 0) for r in range(3)]
    placed = [[id(s) for s in row] for share in shares for mb in share for row in mb]
    for row in rows:  # every tree lands whole on one rank, once
        assert placed.count([id(s) for s in row]) == 1
    assert shares[2] == [padding_micro_batch(0)]  # the third rank runs as many passes


def test_prefix_sharing_keeps_the_unshared_layout_where_it_saves_little():
    """Prompts so short beside their completions that the fold would save under
    MIN_SAVED_FRACTION of the tokens: the step is laid out unshared; with a long prompt it
    folds."""
    g = torch.Generator().manual_seed(0)
    cfg = load_config().batch

    def group(prompt_len: int) -> list[Sample]:
        prompt = torch.randint(3, 400, (prompt_len,), generator=g).tolist()
        return [
            rollout(prompt, [(torch.randint(3, 400, (100,), generator=g).tolist(), True)], g)
            for _ in range(8)
        ]

    def folds(samples: list[Sample], attention: str | None) -> bool:
        plan = plan_micro_batches(samples, 0, 1, cfg, 0, attention)
        return isinstance(plan.layout.collate(plan.micro_batches[0]), FoldedMicroBatch)

    assert folds(group(200), "sdpa") and not folds(group(200), None)
    short = max(1, int(100 * MIN_SAVED_FRACTION))  # saves 7/8 * short / (short + 100)
    assert not folds(group(short), "sdpa")


def test_prefix_sharing_is_off_where_a_sliding_window_can_bind():
    """The tree's mask replaces the model's own, and SDPA applies a sliding window only
    through the mask: a model whose window is shorter than the samples can be trains unshared
    (a window no sample reaches changes nothing, so it may fold)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    def attention(config, max_seq_len: int | None) -> str | None:
        config._attn_implementation = "sdpa"
        model = torch.nn.Module()
        model.config = config
        return tree_attention(model, max_seq_len)

    sliding = Qwen2Config(
        use_sliding_window=True, sliding_window=64, max_window_layers=0, num_hidden_layers=2
    )
    assert attention(sliding, 2048) is None
    assert attention(sliding, 64) == "sdpa"
    assert attention(Qwen2Config(num_hidden_layers=2), 2048) == "sdpa"  # window off
    assert attention(MistralConfig(sliding_window=4096), 8192) is None
    assert attention(MistralConfig(sliding_window=4096), 2048) == "sdpa"
    assert attention(MistralConfig(sliding_window=4096), None) is None  # unknown length
    assert attention(LlamaConfig(), 2048) == "sdpa"


@pytest.mark.parametrize("attention", ["sdpa", None])
def test_a_step_without_samples_plans_no_micro_batches(attention):
    """Every group dropped (errored, zero variance, truncated) under a row cap alone: the
    plan is empty instead of failing on the empty step's bounds."""
    cfg = load_config(overrides=["batch.micro_batch_tokens=null", "batch.micro_batch_size=4"])
    plan = plan_micro_batches([], 0, 1, cfg.batch, 0, attention)
    assert all(not any(mb) for mb in plan.micro_batches)
