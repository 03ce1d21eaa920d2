"""Serving a model with a reasoning vocabulary in vLLM 0.32, switched on by vf-vllm when the
model directory holds `reasoning_vocab.json`: `ReasoningVocabLogitsProcessor` applies
`rlvr.reasoning_vocab.gate`'s rule to every request (one class for both of vLLM's runner
interfaces, scaled by each request's temperature), and `ReasoningVocabTokenizer`
(`--tokenizer-mode rlvr_reasoning_vocab`) loads tokenizer.json as saved, so vLLM's detokenizer
returns the folded text. Design: docs/reasoning-vocabulary.md#serving-in-vllm.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.tokenizers.hf import CachedHfTokenizer, get_cached_tokenizer
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from rlvr.reasoning_vocab.gate import ThinkGate, ThinkTracker
from rlvr.reasoning_vocab.mapping import ReasoningVocab, load_tokenizer
from rlvr.server.plugin import REASONING_VOCAB_PROCESSOR

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams


class ReasoningVocabTokenizer(CachedHfTokenizer):
    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | Path,
        *args: Any,
        trust_remote_code: bool = False,
        revision: str | None = None,
        download_dir: str | None = None,
        **kwargs: Any,
    ):
        tokenizer = load_tokenizer(path_or_repo_id, revision=revision, cache_dir=download_dir)
        for key in ("truncation_side", "padding_side"):
            if key in kwargs:
                setattr(tokenizer, key, kwargs[key])
        return get_cached_tokenizer(tokenizer)


@dataclass
class _Request:
    tracker: ThinkTracker
    temperature: float
    output_ids: list[int] | None
    """V1: the runner's live list of the request's output ids (None under V2)."""
    consumed: int = 0
    """V1: output ids fed to the tracker; V2: sequence tokens fed to the tracker."""


def load_gate(vllm_config: VllmConfig) -> ThinkGate:
    model_config = vllm_config.model_config
    vocab = ReasoningVocab.load(model_config.model)
    if vocab is None:
        raise ValueError(
            f"{REASONING_VOCAB_PROCESSOR} needs a model directory with a reasoning vocabulary "
            f"(reasoning_vocab.json); {model_config.model} has none"
        )
    width = model_config.get_vocab_size()
    if width != vocab.total_vocab_size:
        raise ValueError(
            f"the served model has {width} vocabulary rows; its reasoning vocabulary needs "
            f"{vocab.total_vocab_size}"
        )
    return ThinkGate.from_tokenizer(vocab, load_tokenizer(model_config.tokenizer))


class ReasoningVocabLogitsProcessor(V1LogitsProcessor, V2LogitsProcessor):
    """Reasoning ids only inside think spans (docs/reasoning-vocabulary.md#serving-in-vllm)."""

    def __init__(self, vllm_config: VllmConfig, *runner_args: Any):
        if vllm_config.speculative_config is not None:
            raise ValueError("the reasoning-vocabulary gate does not support speculative decoding")
        self.gate = load_gate(vllm_config)
        # V2 passes (req_states,), V1 passes (device, is_pin_memory)
        self.req_states = runner_args[0] if len(runner_args) == 1 else None
        self.requests: dict[int, _Request] = {}

    # ---- V1 runner ----------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.requests, batch_update, self._new_v1_request)

    def _new_v1_request(
        self, params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]
    ) -> _Request:
        tracker = self.gate.tracker()
        self._feed(tracker, prompt_ids or [])
        return _Request(tracker, params.temperature, output_ids)

    def _rows_v1(self, rows: int) -> tuple[list[bool], list[float]]:
        inside, temperatures = [False] * rows, [1.0] * rows
        for index, request in self.requests.items():
            new = request.output_ids[request.consumed :]
            if -1 in new:  # an async-scheduling placeholder: its token is not known yet
                new = new[: new.index(-1)]
            self._feed(request.tracker, new)
            request.consumed += len(new)
            if index < rows:
                inside[index] = request.tracker.inside
                temperatures[index] = request.temperature
        return inside, temperatures

    # ---- V2 runner ----------------------------------------------------------------------

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        self.requests[req_idx] = _Request(self.gate.tracker(), sampling_params.temperature, None)
        return True

    def _rows_v2(self, ctx: LogitsContext) -> tuple[list[bool], list[float]]:
        """Rows are requests (no speculative decoding); a row's own input token (the latest
        sampled one, or the last prompt token) is at `pos` and may not be committed to the
        history yet, so it is looked at, not consumed."""
        history = self.req_states.all_token_ids.gpu
        positions, last_tokens = ctx.pos.tolist(), ctx.input_ids.tolist()
        inside, temperatures = [], []
        for row, slot in enumerate(ctx.idx_mapping_np.tolist()):
            request = self.requests[slot]
            position = positions[row]
            if request.consumed < position:
                self._feed(request.tracker, history[slot, request.consumed : position].tolist())
                request.consumed = position
            inside.append(request.tracker.peek(self.gate.piece(last_tokens[row])))
            temperatures.append(request.temperature)
        return inside, temperatures

    # ---- both ---------------------------------------------------------------------------

    def _feed(self, tracker: ThinkTracker, ids: list[int]) -> None:
        for token in ids:
            tracker.feed(self.gate.piece(token))

    def apply(self, logits: torch.Tensor, ctx: LogitsContext | None = None) -> torch.Tensor:
        inside, temperatures = self._rows_v1(logits.shape[0]) if ctx is None else self._rows_v2(ctx)
        return self.gate.gate_logits_(
            logits,
            torch.tensor(inside, device=logits.device),
            torch.tensor(temperatures, dtype=torch.float32, device=logits.device),
        )
