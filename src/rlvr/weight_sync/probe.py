"""Is the server's model the trainer's? One short forward probe: both sides score a fixed token
sequence (`probe_ids`) and their mean mismatch (`probe_kl`) must stay under an absolute limit.

The exact check (rlvr.weight_sync.exact_check) proves what each push delivered, parameter by
parameter. What it cannot see is the model around the weights: another model or tokenizer
behind the name, kernels that compute something else, a reasoning vocabulary's gate. The probe
checks that at a server's first push (start, resume, a returning server), and at every push into
a server the exact check cannot reach, where it is the only check (its limits:
docs/weight-transfer.md#the-model-probe). `ModelProbe.check` raises `WeightsNotServedError`;
NaN never passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rlvr.reasoning_vocab.mapping import ReasoningVocab

if TYPE_CHECKING:
    from rlvr.weight_sync.control import ServerControl

PROBE_TEXT = (
    "Question: A farmer has 17 sheep and buys 23 more. How many sheep does he have now?\n"
    "Answer: He starts with 17 and adds 23, so 17 + 23 = 40. The answer is 40.\n"
    "def add(a, b):\n    return a + b\n"
)
REASONING_PROBE_IDS = 16
"""How many of a reasoning vocabulary's added ids the probe's think span holds."""
PROBE_KL_CAP = 1e-2
"""The most `push/probe_kl` a probe allows by default: a bf16 server against a float32 trainer
measures ~1e-3 on SmolLM2, another model or broken kernels far more."""


class WeightsNotServedError(RuntimeError):
    """The server does not serve the weights that were just pushed."""


NOT_SERVED = (
    "The server does not serve the trainer's model: another model or tokenizer behind the "
    "name, a push that did not arrive, or kernels that compute something else."
)
TURN_OFF = "server.push_probe=false turns the probe off."
BROKEN_POLICY = (
    "The policy's weights are broken (a non-finite update?): resume from the last checkpoint."
)
BROKEN_SERVER = f"The server computes non-finite values for the pushed weights. {NOT_SERVED}"


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


def non_finite(what: str, values: torch.Tensor) -> str | None:
    """A message naming `what`'s non-finite entries (None: all finite)."""
    bad = (~torch.isfinite(values)).nonzero()[:, 0].tolist()
    if not bad:
        return None
    shown = ", ".join(f"token {i}: {values[i].item()}" for i in bad[:5])
    return f"{len(bad)} of {len(values)} of {what} log-probabilities are not finite ({shown})"


class ModelProbe:
    """The probe of one server: its token ids and absolute limit (`kl_max`). Every rank checks
    the same (broadcast) scores, so all ranks pass or raise together."""

    def __init__(self, ids: list[int], kl_max: float | None = None):
        self.ids = ids
        self.kl_max = kl_max if kl_max is not None else PROBE_KL_CAP
        self.configured = kl_max is not None

    def check(
        self, trainer: torch.Tensor, served: torch.Tensor, version: int, model: str
    ) -> dict[str, float]:
        """Raise `WeightsNotServedError` unless the server's scores of weight `version` are
        the trainer's within the limit; return `push/probe_kl`."""
        where = f"after the push of weight version {version}, {model!r} on the server"
        sides = [("the trainer's", trainer, BROKEN_POLICY), ("the server's", served, BROKEN_SERVER)]
        for what, values, advice in sides:
            problem = non_finite(what, values)
            if problem is not None:
                raise WeightsNotServedError(f"{where}: {problem}. {advice}")
        kl = probe_kl(trainer, served)
        if not (kl <= self.kl_max):
            how = "server.probe_kl_max" if self.configured else "the default limit"
            raise WeightsNotServedError(
                f"{where} scores a fixed token sequence differently from the trainer's weights: "
                f"push/probe_kl {kl:.3g} > {how} {self.kl_max:.3g}. {NOT_SERVED} If the server "
                f"computes in lower precision than this allows, raise server.probe_kl_max. "
                f"{TURN_OFF}"
            )
        return {"push/probe_kl": kl}
