"""Did the weights arrive? After every push, one short probe checks that the server serves
exactly what the trainer just pushed.

Mismatch-KL (sampler vs trainer on the sampled tokens) cannot answer this at `async_level` >= 1:
the sampled tokens come from an older policy, so it also measures how far the policy moved
since, and a server that kept serving stale weights looks like ordinary lag. The probe
compares the same weights on both sides instead, whatever the lag:

- a fixed token sequence (`probe_ids`: prose, numbers and code; with a reasoning vocabulary, a
  think span of its added ids too, since those rows train as well);
- the server scores it with prompt log-probabilities (`/v1/completions`, `prompt_logprobs`,
  token ids in, so no tokenizer mode is involved), under the model name rollouts of the new
  version will request: the version's adapter under adapter sync, the base name under
  merged pushes;
- the trainer scores it with the weights it just pushed, a forward on every rank (ZeRO-3
  gathers parameters in lockstep), right after the push;
- `push/probe_kl` is the mean over the sequence of exp(d) - 1 - d, d = trainer - server
  log-probability of each token: mismatch-KL's estimator (`rlvr.trainer.loss`), zero exactly when
  both sides agree. Above the limit the push raises on every rank.

The limit (`server.probe_kl_max`, or calibrated): server and trainer never agree to the last
bit (kernels, and dtypes: ~1e-13 with float32 on both sides, ~1e-3 for a bf16 server against
a float32 trainer on SmolLM2), while one optimizer step moves the probe by far less than 1e-3
at usual learning rates. No fixed number fits both, so by default the initial push, where
both sides hold the same weights, measures the rounding between these two implementations
and later pushes may exceed it tenfold, never less than `PROBE_KL_FLOOR` (run-to-run noise
of float32) and never more than `PROBE_KL_CAP` (which the initial push must pass too).

vLLM 0.32 computes prompt log-probabilities from the raw logits (`gpu_model_runner.
_get_prompt_logprobs_dict`: "prompt tokens skip sampling processors", so no temperature, no
top-k/top-p, no logits processor such as the think gate) under both `raw_logprobs` and
`processed_logprobs`; the trainer side is therefore a plain log-softmax at temperature 1, no
mask. A server in a `*_logits` mode returns logits there, and the probe fails (vf-vllm never
runs in one).

Why a probe rather than mismatch-KL restricted to on-policy samples: at the default
async_level every batch lags, so that restriction would leave nothing to check. The probe
costs one forward of ~80 tokens and one prompt-only request per push.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlvr.reasoning_vocab.mapping import ReasoningVocab

if TYPE_CHECKING:
    from rlvr.weight_sync.push import ServerControl

PROBE_TEXT = (
    "Question: A farmer has 17 sheep and buys 23 more. How many sheep does he have now?\n"
    "Answer: He starts with 17 and adds 23, so 17 + 23 = 40. The answer is 40.\n"
    "def add(a, b):\n    return a + b\n"
)
REASONING_PROBE_IDS = 16
"""How many of a reasoning vocabulary's added ids the probe's think span holds."""
PROBE_KL_FLOOR = 1e-6
PROBE_KL_CAP = 1e-2
PROBE_KL_HEADROOM = 10.0


class WeightsNotServedError(RuntimeError):
    """The server does not serve the weights that were just pushed."""


def probe_ids(tokenizer: Any, vocab: ReasoningVocab | None = None) -> list[int]:
    """The probe's token ids: `PROBE_TEXT`, and with a reasoning vocabulary a think span of
    its first added ids."""
    ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    if vocab is None:
        return ids
    first = vocab.base_vocab_size
    added = range(first, first + min(vocab.size, REASONING_PROBE_IDS))
    start = tokenizer.encode(vocab.think_start, add_special_tokens=False)
    end = tokenizer.encode(vocab.think_end, add_special_tokens=False)
    return [*start, *added, *end, *ids]


@torch.no_grad()
def trainer_logprobs(model: torch.nn.Module, ids: list[int], device: Any) -> torch.Tensor:
    """The log-probability of each probe token after the first, at temperature 1 (in eval
    mode: no dropout). Every rank calls it together under ZeRO-3."""
    was_training = model.training
    model.eval()
    try:
        inputs = torch.tensor([ids], device=device)
        logits = model(input_ids=inputs, use_cache=False).logits[0, :-1].float()
    finally:
        model.train(was_training)
    targets = inputs[0, 1:, None]
    return logits.log_softmax(-1).gather(-1, targets)[:, 0].cpu()


def served_logprobs(control: ServerControl, model: str, ids: list[int]) -> torch.Tensor:
    """The server's log-probability of each probe token after the first, from `model`."""
    body = {"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}
    entries = control.post("/v1/completions", json=body)["choices"][0]["prompt_logprobs"][1:]
    return torch.tensor(
        [entry[str(token)]["logprob"] for entry, token in zip(entries, ids[1:], strict=True)]
    )


def probe_kl(trainer: torch.Tensor, served: torch.Tensor) -> float:
    """Mean of exp(d) - 1 - d over the tokens, d = trainer - served log-probability."""
    d = (trainer - served).double()
    return float((torch.expm1(d) - d).mean())


class PushProbe:
    """The probe's token ids and its limit, calibrated at the first check unless `kl_max`
    fixes it. Every rank holds one and checks the same (broadcast) value."""

    def __init__(self, ids: list[int], kl_max: float | None = None):
        self.ids = ids
        self.kl_max = kl_max if kl_max is not None else PROBE_KL_CAP
        self.configured = kl_max is not None
        self.calibrated = self.configured

    def check(self, kl: float, version: int, model: str) -> None:
        """Raise when `kl` says the server does not serve weight `version`."""
        if kl > self.kl_max:
            how = "server.probe_kl_max" if self.configured else "the probe's calibrated limit"
            raise WeightsNotServedError(
                f"after the push of weight version {version}, {model!r} on the server scores "
                f"a fixed token sequence differently from the trainer's weights: push/probe_kl "
                f"{kl:.3g} > {how} {self.kl_max:.3g}. The server does not serve what was "
                "pushed (a failed or partial transfer, or another process pushing into it). If "
                "the server computes in lower precision than this allows, set "
                "server.probe_kl_max; server.push_probe=false turns the check off."
            )
        if not self.calibrated:
            self.kl_max = min(max(PROBE_KL_HEADROOM * kl, PROBE_KL_FLOOR), PROBE_KL_CAP)
            self.calibrated = True
