"""Where a reasoning vocabulary may be used: the think-span rule and the logits it shapes, one
rule for the sampler (vf-vllm's logits processor) and the trainer, so the importance ratio
compares like with like. Outside a think span reasoning ids get -inf; inside, a copied token and
its copy each get log(1/2), so expansion alone changes no distribution over text. `fold` mode
(SFT) sums each pair's probability onto the original id.
Design: docs/reasoning-vocabulary.md#the-gate-in-sampling-and-in-the-loss-alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.batch import MicroBatch, Sample
from rlvr.reasoning_vocab.mapping import ReasoningVocab

LOG_HALF = -math.log(2.0)


@dataclass
class ThinkTracker:
    """Incremental think-span state over token texts: `feed` one token's text, get whether the
    next token is inside a span. Keeps only the last `len(longest delimiter) - 1` characters, so
    a delimiter split across tokens is still seen and memory stays constant."""

    start: str
    end: str
    inside: bool = False
    tail: str = ""
    keep: int = field(init=False)

    def __post_init__(self) -> None:
        self.keep = max(len(self.start), len(self.end)) - 1

    def _after(self, piece: str) -> tuple[bool, str]:
        text = self.tail + piece
        start_at, end_at = text.rfind(self.start), text.rfind(self.end)
        inside = self.inside
        if start_at >= 0 or end_at >= 0:
            # compare where the two last occurrences end (-1: none)
            start_end = start_at + len(self.start) if start_at >= 0 else -1
            end_end = end_at + len(self.end) if end_at >= 0 else -1
            inside = start_end > end_end
        return inside, text[-self.keep :] if self.keep else ""

    def feed(self, piece: str) -> bool:
        self.inside, self.tail = self._after(piece)
        return self.inside

    def peek(self, piece: str) -> bool:
        """The state `feed(piece)` would reach, without changing this tracker."""
        return self._after(piece)[0]


class ThinkGate:
    """The rule for one model: its reasoning vocabulary and the text of every token id."""

    def __init__(self, vocab: ReasoningVocab, pieces: Sequence[str]):
        if len(pieces) < vocab.base_vocab_size:
            raise ValueError(
                f"{len(pieces)} token pieces for a base vocabulary of {vocab.base_vocab_size}"
            )
        self.vocab = vocab
        base = list(pieces[: vocab.base_vocab_size])
        self.pieces = base + [base[i] for i in vocab.original_ids]
        self._bias: dict[torch.device, torch.Tensor] = {}

    @classmethod
    def from_tokenizer(cls, vocab: ReasoningVocab, tokenizer: Any) -> ThinkGate:
        """Pieces are each base id decoded on its own (ids the tokenizer lacks, such as
        Qwen's padding rows, are empty)."""
        return cls(vocab, token_pieces(tokenizer, vocab.base_vocab_size))

    def tracker(self) -> ThinkTracker:
        return ThinkTracker(self.vocab.think_start, self.vocab.think_end)

    def piece(self, token: int) -> str:
        """A token's text (reasoning ids read as their originals; "" for unknown ids)."""
        return self.pieces[token] if 0 <= token < len(self.pieces) else ""

    def inside(self, ids: Iterable[int]) -> list[bool]:
        """For each position i: may token i+1 be a reasoning id (is the text of ids[:i+1]
        inside a think span)? The pure form of the rule, for any sequence of ids."""
        tracker = self.tracker()
        return [tracker.feed(self.piece(i)) for i in ids]

    def micro_batch_inside(self, mb: MicroBatch) -> torch.Tensor:
        """[B, T-1] bool, aligned with `mb.loss_mask`: is column c's prediction (token c+1 of
        its row) inside a think span? Each packed sample is tracked from its own start."""
        ids = mb.input_ids.tolist()
        starts = mb.position_ids.eq(0).tolist() if mb.position_ids is not None else None
        grid = []
        for r, row in enumerate(ids):
            tracker = self.tracker()
            out = []
            for c, token in enumerate(row[:-1]):
                if c and starts is not None and starts[r][c]:
                    tracker = self.tracker()
                out.append(tracker.feed(self.piece(token)))
            grid.append(out)
        rows, width = mb.input_ids.shape
        return torch.tensor(grid, dtype=torch.bool).view(rows, width - 1)

    def logit_mask(self, mb: MicroBatch, fold: bool = False):
        """The `mask_logits(logits, positions)` hook of `rlvr.trainer.logprobs` for this micro-batch
        (its logits arrive divided by the temperature): the gate (GRPO: the distribution the
        sampler drew from) or, with `fold`, the folded distribution over text tokens (SFT)."""
        inside = self.micro_batch_inside(mb).flatten().to(mb.input_ids.device)
        shape = self.fold_logits if fold else self.gate_logits

        def mask_logits(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return shape(logits, inside[positions])

        return mask_logits

    def sample_counts(self, sample: Sample) -> tuple[int, int, int]:
        """(thinking tokens, of them reasoning ids, reasoning ids outside any think span)
        among the tokens the policy sampled (loss mask 1)."""
        inside = self.inside(sample.input_ids)
        base = self.vocab.base_vocab_size
        think = reasoning = outside = 0
        for t in range(1, len(sample)):
            if not sample.loss_mask[t]:
                continue
            is_reasoning = sample.input_ids[t] >= base
            if inside[t - 1]:
                think += 1
                reasoning += is_reasoning
            else:
                outside += is_reasoning
        return think, reasoning, outside

    def rollout_metrics(self, samples: Iterable[Sample]) -> dict[str, float]:
        """`reasoning/think_tokens`: share of sampled tokens inside think spans;
        `reasoning/reasoning_id_share`: share of those that are reasoning ids. Raises when the
        sampler put a reasoning id outside a span (the server is not gating)."""
        think = reasoning = outside = sampled = 0
        for sample in samples:
            t, r, o = self.sample_counts(sample)
            think, reasoning, outside = think + t, reasoning + r, outside + o
            sampled += sample.num_loss_tokens
        if outside:
            raise RuntimeError(
                f"the sampler produced {outside} reasoning ids outside think spans: vf-vllm must "
                "serve this model with the reasoning-vocabulary logits processor (it does so "
                "for a model directory with reasoning_vocab.json)"
            )
        return {
            "reasoning/think_tokens": think / max(sampled, 1),
            "reasoning/reasoning_id_share": reasoning / max(think, 1),
        }

    # ---- logits --------------------------------------------------------------------------

    def bias_table(self, device: torch.device) -> torch.Tensor:
        """[2, V + N] additive biases for temperature-scaled logits: row 0 outside a span
        (-inf on reasoning ids), row 1 inside (log 1/2 on every copied original and its copy)."""
        key = torch.device(device)
        if key not in self._bias:
            table = torch.zeros(2, self.vocab.total_vocab_size, dtype=torch.float32)
            table[0, self.vocab.base_vocab_size :] = -math.inf
            table[1, self._pair_columns("cpu")] = LOG_HALF
            self._bias[key] = table.to(device)
        return self._bias[key]

    def _pair_columns(self, device: torch.device | str) -> torch.Tensor:
        v = self.vocab
        originals = torch.tensor(v.original_ids, dtype=torch.long)
        return torch.cat([originals, torch.arange(v.base_vocab_size, v.total_vocab_size)]).to(
            device
        )

    def gate_logits(self, logits: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
        """Apply the rule to temperature-scaled `logits` [n, V + N] (float32, the trainer's),
        rows inside a span where `inside` [n] is true. Returns a new tensor (autograd-safe)."""
        self._check_width(logits)
        return logits + self.bias_table(logits.device)[inside.long()]

    def gate_logits_(
        self, logits: torch.Tensor, inside: torch.Tensor, temperatures: torch.Tensor
    ) -> torch.Tensor:
        """The same rule in place on raw logits that each row's temperature will divide later
        (vLLM's processors run before the temperature): the split is log(1/2) times the row's
        temperature, so that after the division it is log(1/2), exactly as in `gate_logits`.
        (A split of log(1/2) before the division would hold the pair at 2^(1-1/T) times the
        original token's probability mass.)"""
        self._check_width(logits)
        logits[(~inside).nonzero()[:, 0], self.vocab.base_vocab_size :] = -math.inf
        rows = inside.nonzero()[:, 0]
        if rows.numel():
            columns = self._pair_columns(logits.device)
            split = (LOG_HALF * temperatures[rows]).to(logits.dtype)[:, None]
            logits[rows[:, None], columns] += split
        return logits

    def fold_logits(self, logits: torch.Tensor, inside: torch.Tensor) -> torch.Tensor:
        """The gated distribution with each reasoning id's probability added to its original
        (log-space), reasoning columns left at -inf: log_softmax of the result is the model's
        distribution over text tokens."""
        gated = self.gate_logits(logits, inside)
        base = self.vocab.base_vocab_size
        originals = torch.tensor(self.vocab.original_ids, dtype=torch.long, device=logits.device)
        copies = gated[:, base:]
        pair = torch.logaddexp(gated[:, originals], copies)
        folded = gated[:, :base].index_copy(1, originals, pair)
        return torch.cat([folded, torch.full_like(copies, -math.inf)], dim=1)

    def _check_width(self, logits: torch.Tensor) -> None:
        if logits.shape[-1] != self.vocab.total_vocab_size:
            raise ValueError(
                f"logits have {logits.shape[-1]} columns; the reasoning vocabulary needs "
                f"{self.vocab.total_vocab_size} (base {self.vocab.base_vocab_size} + "
                f"{self.vocab.size} copies)"
            )


def token_pieces(tokenizer: Any, count: int) -> list[str]:
    """The text of each id in [0, count) decoded alone (special tokens included, so a
    delimiter that is one special token is seen); "" for ids the tokenizer does not have."""
    known = min(count, len(tokenizer))
    pieces = tokenizer.batch_decode(
        [[i] for i in range(known)], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    return pieces + [""] * (count - known)
