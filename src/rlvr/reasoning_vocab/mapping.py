"""A reasoning vocabulary: N extra token ids, id V + j a copy of an ordinary token, so what the
model writes while thinking can drift away from what it writes in its answer. Copies the first
N non-special ids; V is the embedding size; expansion (`expand_model`) grows the embedding and
head by copied rows after the weights load, every original row untouched; the mapping travels
as `reasoning_vocab.json`; the expanded tokenizer decodes a copy as its original.
Where reasoning ids may be used is `rlvr.reasoning_vocab.gate`'s business.
Design: docs/reasoning-vocabulary.md#what-is-copied.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.atomic import atomic_write_text
from rlvr.config import ConfigError, ModelConfig, delimiters_ok
from rlvr.model.zero3 import zero3_gather

MAPPING_FILE = "reasoning_vocab.json"
MARKER = "\ue000"
"""Prefixed to a reasoning token's vocabulary string; removed again by the decoder."""


class ReasoningVocabError(ValueError):
    """The tokenizer or model cannot carry a reasoning vocabulary (the message says why)."""


@dataclass(frozen=True)
class ReasoningVocab:
    base_vocab_size: int
    """V: the model's embedding rows before expansion; reasoning ids are V .. V + N - 1."""
    original_ids: tuple[int, ...]
    """Reasoning id V + j copies token original_ids[j]."""
    think_start: str = "<think>"
    think_end: str = "</think>"

    def __post_init__(self) -> None:
        ids = self.original_ids
        if not ids:
            raise ReasoningVocabError("a reasoning vocabulary needs at least one copied token")
        if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= self.base_vocab_size:
            raise ReasoningVocabError(
                f"copied ids must be distinct and in [0, {self.base_vocab_size})"
            )
        if not delimiters_ok(self.think_start, self.think_end):
            raise ReasoningVocabError(
                f"think delimiters {self.think_start!r}, {self.think_end!r}: both must be "
                "non-empty and neither may contain the other"
            )

    @property
    def size(self) -> int:
        return len(self.original_ids)

    @property
    def total_vocab_size(self) -> int:
        return self.base_vocab_size + self.size

    def fold(self, ids: Iterable[int]) -> list[int]:
        """Reasoning ids replaced by their originals (other ids unchanged)."""
        base, originals = self.base_vocab_size, self.original_ids
        return [originals[i - base] if i >= base else i for i in ids]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / MAPPING_FILE
        data = asdict(self)
        data["original_ids"] = list(self.original_ids)
        atomic_write_text(path, json.dumps(data) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> ReasoningVocab | None:
        """The mapping saved in `directory`, or None when it has none (or is a hub id)."""
        path = Path(directory) / MAPPING_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        try:
            data["original_ids"] = tuple(data["original_ids"])
            return cls(**data)
        except (KeyError, TypeError, ReasoningVocabError) as e:
            raise ReasoningVocabError(f"{path} is not a valid reasoning vocabulary: {e}") from e


# ---- which tokens are copied --------------------------------------------------------------


def _tokenizer_state(tokenizer: Any) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ReasoningVocabError(
            f"{type(tokenizer).__name__} is not a fast tokenizer: a reasoning vocabulary "
            "needs the tokenizer.json of a fast (Rust) tokenizer"
        )
    state = json.loads(backend.to_str())
    if not isinstance(state.get("model", {}).get("vocab"), dict):
        kind = state.get("model", {}).get("type")
        raise ReasoningVocabError(
            f"the tokenizer's model ({kind}) keeps no vocabulary mapping; a reasoning "
            "vocabulary needs a BPE or WordLevel tokenizer"
        )
    return state


def copyable_ids(tokenizer: Any, vocab_size: int) -> list[int]:
    """Ids below `vocab_size` of the tokenizer's own vocabulary that are not special or added
    tokens, ascending."""
    vocab = _tokenizer_state(tokenizer)["model"]["vocab"]
    excluded = set(getattr(tokenizer, "added_tokens_decoder", {})) | set(tokenizer.all_special_ids)
    return sorted(i for i in vocab.values() if i < vocab_size and i not in excluded)


def select(
    tokenizer: Any, vocab_size: int, size: int, think_start: str, think_end: str
) -> ReasoningVocab:
    """The mapping for `size` copies (-1: every copyable token) of a model with `vocab_size`
    embedding rows."""
    candidates = copyable_ids(tokenizer, vocab_size)
    if size == -1:
        size = len(candidates)
    if not 1 <= size <= len(candidates):
        raise ConfigError(
            f"model.reasoning_vocab_size={size}: the tokenizer has {len(candidates)} "
            "non-special tokens to copy (-1 copies them all)"
        )
    return ReasoningVocab(vocab_size, tuple(candidates[:size]), think_start, think_end)


# ---- the model ----------------------------------------------------------------------------


def embedding_rows(model: torch.nn.Module) -> int:
    weight = model.get_input_embeddings().weight
    return int(getattr(weight, "ds_shape", weight.shape)[0])


@contextlib.contextmanager
def _writable(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Whole parameters to modify in place; under ZeRO-3 gathered, and rank 0's values (every
    rank computes the same) partitioned again on exit."""
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            yield
        return
    yield


def _head_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The output head's weight (and bias) when it is not the input embedding itself."""
    head = model.get_output_embeddings()
    if head is None or head.weight is model.get_input_embeddings().weight:
        return []
    return [p for p in (head.weight, getattr(head, "bias", None)) if p is not None]


@torch.no_grad()
def expand_model(model: torch.nn.Module, vocab: ReasoningVocab) -> None:
    """Grow the loaded model's embedding and output head by `vocab.size` rows copying the
    originals (in place; ties between embedding and head are kept)."""
    rows = embedding_rows(model)
    if rows != vocab.base_vocab_size:
        raise ReasoningVocabError(
            f"the model has {rows} embedding rows; this reasoning vocabulary expands "
            f"{vocab.base_vocab_size}"
        )
    model.resize_token_embeddings(vocab.total_vocab_size, mean_resizing=False)
    params = [model.get_input_embeddings().weight, *_head_params(model)]
    source = torch.tensor(vocab.original_ids, dtype=torch.long)
    with _writable(params):
        for param in params:
            param[vocab.base_vocab_size :] = param[source.to(param.device)]


# ---- the tokenizer ------------------------------------------------------------------------


def add_reasoning_tokens(state: dict, vocab: ReasoningVocab) -> dict:
    """A tokenizer.json (as a dict) that also decodes each reasoning id as its original."""
    model_vocab: dict[str, int] = state["model"]["vocab"]
    if any(MARKER in token for token in model_vocab):
        raise ReasoningVocabError("the tokenizer already carries a reasoning vocabulary")
    taken = set(model_vocab.values()) | {t["id"] for t in state.get("added_tokens") or []}
    if max(taken) >= vocab.base_vocab_size:
        raise ReasoningVocabError(
            f"the tokenizer has ids at or above the model's vocabulary size "
            f"{vocab.base_vocab_size}, where reasoning ids go"
        )
    strings = {i: token for token, i in model_vocab.items()}
    for j, original in enumerate(vocab.original_ids):
        model_vocab[MARKER + strings[original]] = vocab.base_vocab_size + j
    unmark = {"type": "Replace", "pattern": {"String": MARKER}, "content": ""}
    decoder = state.get("decoder")
    state["decoder"] = {"type": "Sequence", "decoders": [unmark, *([decoder] if decoder else [])]}
    return state


def decodes_reasoning(tokenizer: Any, vocab: ReasoningVocab) -> bool:
    """Does `tokenizer` decode the reasoning ids as their originals?"""
    probe = list(range(vocab.base_vocab_size, vocab.total_vocab_size, max(1, vocab.size // 64)))
    return tokenizer.decode(probe) == tokenizer.decode(vocab.fold(probe))


def load_tokenizer(path: str | Path, **kwargs: Any) -> Any:
    """The tokenizer of a model directory, as it is saved there: with a reasoning vocabulary
    through the generic `TokenizersBackend`, since `AutoTokenizer` rebuilds some types' (Qwen2's)
    with their own decoder, dropping the one that folds reasoning ids (vf-vllm does the same)."""
    from transformers import AutoTokenizer, TokenizersBackend

    if ReasoningVocab.load(path) is not None:
        return TokenizersBackend.from_pretrained(path, **kwargs)
    return AutoTokenizer.from_pretrained(path, **kwargs)


def expand_tokenizer(tokenizer: Any, vocab: ReasoningVocab) -> Any:
    """A copy of `tokenizer` that knows the reasoning ids (encoding is unchanged)."""
    from transformers import TokenizersBackend

    state = add_reasoning_tokens(_tokenizer_state(tokenizer), vocab)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        Path(tmp, "tokenizer.json").write_text(json.dumps(state, ensure_ascii=False))
        expanded = TokenizersBackend.from_pretrained(tmp)
    if not decodes_reasoning(expanded, vocab):
        raise ReasoningVocabError("the expanded tokenizer does not decode reasoning ids")
    return expanded


# ---- loading, saving ----------------------------------------------------------------------


def attach(
    model: torch.nn.Module, tokenizer: Any, cfg: ModelConfig, path: str
) -> tuple[Any, ReasoningVocab | None]:
    """After `path`'s weights are loaded: restore the reasoning vocabulary saved there, or
    create the one `cfg` asks for. Returns the tokenizer to use (expanded when there is a
    reasoning vocabulary) and the mapping (None when off)."""
    saved = ReasoningVocab.load(path)
    if saved is None:
        if cfg.reasoning_vocab_size == 0:
            return tokenizer, None
        vocab = select(
            tokenizer,
            embedding_rows(model),
            cfg.reasoning_vocab_size,
            cfg.reasoning_start,
            cfg.reasoning_end,
        )
        expand_model(model, vocab)
        return expand_tokenizer(tokenizer, vocab), vocab
    if embedding_rows(model) != saved.total_vocab_size:
        raise ReasoningVocabError(
            f"{path} carries a reasoning vocabulary of {saved.total_vocab_size} ids but the "
            f"model has {embedding_rows(model)} embedding rows"
        )
    if cfg.reasoning_vocab_size != 0:
        wanted = select(
            tokenizer,
            saved.base_vocab_size,
            cfg.reasoning_vocab_size,
            cfg.reasoning_start,
            cfg.reasoning_end,
        )
        if wanted != saved:
            raise ConfigError(
                f"model.reasoning_vocab_size={cfg.reasoning_vocab_size} (delimiters "
                f"{cfg.reasoning_start!r}, {cfg.reasoning_end!r}) differs from the reasoning "
                f"vocabulary {path} already carries ({saved.size} ids, delimiters "
                f"{saved.think_start!r}, {saved.think_end!r}); set it to 0 to keep that one"
            )
    if not decodes_reasoning(tokenizer, saved):
        tokenizer = expand_tokenizer(tokenizer, saved)
    return tokenizer, saved


# ---- metrics ------------------------------------------------------------------------------


def _active_token_adapters(layer: torch.nn.Module) -> list[str]:
    return [a for a in layer.active_adapters if a in layer.trainable_tokens_delta]


def trained_rows_params(layer: torch.nn.Module) -> list[torch.nn.Parameter]:
    """A PEFT trainable-tokens layer's base weight and its trained rows (what to gather)."""
    deltas = layer.trainable_tokens_delta
    return [layer.base_layer.weight, *(deltas[a] for a in _active_token_adapters(layer))]


def with_trained_rows(layer: torch.nn.Module) -> torch.Tensor:
    """A PEFT trainable-tokens layer's weight as it computes with it: the base weight with
    the trained rows in place."""
    return layer.get_merged_weights(_active_token_adapters(layer))


def _effective_weight(module: torch.nn.Module) -> tuple[torch.Tensor, list[torch.nn.Parameter]]:
    """The weight the module computes with (PEFT's trainable token rows merged in) and the
    parameters behind it."""
    adapter = getattr(module, "token_adapter", None)
    if adapter is None:
        return module.weight, [module.weight]
    return with_trained_rows(adapter), trained_rows_params(adapter)


def _base_weight(module: torch.nn.Module) -> torch.nn.Parameter:
    return _effective_weight(module)[1][0]


@torch.no_grad()
def row_cosines(model: torch.nn.Module, vocab: ReasoningVocab) -> dict[str, float]:
    """Mean cosine similarity between each reasoning row and its original row, in the input
    embedding and (when untied) the output head: 1 right after expansion, falling as training
    moves them apart. Under ZeRO-3 every rank must call this (the rows are gathered)."""
    source = torch.tensor(vocab.original_ids, dtype=torch.long)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    modules = {"embedding": embedding}
    if head is not None and _base_weight(head) is not _base_weight(embedding):
        modules["head"] = head  # untied
    out = {}
    for name, module in modules.items():
        _, params = _effective_weight(module)
        with zero3_gather(params):
            weight = _effective_weight(module)[0].float()
            copies = weight[vocab.base_vocab_size : vocab.total_vocab_size]
            originals = weight[source.to(weight.device)]
            cos = torch.nn.functional.cosine_similarity(copies, originals, dim=-1)
            out[f"reasoning/{name}_cosine"] = float(cos.mean())
    return out
