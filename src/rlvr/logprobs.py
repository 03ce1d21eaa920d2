"""Per-token log-probabilities and entropy of the trainer's policy, from its logits."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0):
    """Log-probability of each next token: out[:, i] = log p(input_ids[:, i+1] | ids[:, :i+1]).

    `logits` is [B, T, V] for inputs [B, T]; the result is [B, T-1] in float32. Dividing by
    the sampling temperature makes these the probabilities tokens were sampled from.
    """
    logits = logits[:, :-1].float() / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = torch.gather(logits, -1, targets).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def masked_entropy_sum(
    logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Sum of the policy's entropy over loss tokens (for logging; no gradient).

    `logits` [B, T, V] and `mask` [B, T-1] aligned like `token_logprobs`. Only the masked
    positions are expanded to full distributions, which keeps memory at tokens x vocab.
    """
    picked = logits[:, :-1][mask.bool()].float() / temperature
    if picked.numel() == 0:
        return torch.zeros((), device=logits.device)
    logp = torch.log_softmax(picked, dim=-1)
    return -(logp.exp() * logp).sum()
