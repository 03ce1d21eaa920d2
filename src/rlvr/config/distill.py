"""`distill.*`: on-policy distillation from a served teacher.

Each field is checked by `DistillConfig.validate`. Design: docs/training.md#on-policy-distillation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.config.checks import require
from rlvr.config.server import check_server_urls


@dataclass
class DistillConfig:
    """`distill.*`: the teacher that scores every sampled token, and how much its score counts."""

    base_url: str | None = None
    """The teacher's server (a vf-vllm, or any vLLM OpenAI server): its OpenAI base URL. None
    (and no `base_urls`): no distillation."""
    base_urls: list[str] = field(default_factory=list)
    """Several servers serving the same teacher: the samples are spread over them, and one
    that fails is left for the others. Set this or `base_url`, not both."""
    model: str | None = None
    """The name the teacher is served under (a model, or an adapter on a base: `--lora-modules`);
    None: the first model the server lists."""
    api_key: str | None = None
    coef: float = 1.0
    """The weight of the distillation term: each sampled token's advantage gains
    coef x (teacher log-probability - sampler log-probability), the negative per-token reverse
    KL (docs/training.md#on-policy-distillation)."""
    rewards: bool = True
    """true: GRPO plus distillation (the environment's group advantages still count). false:
    pure distillation: the teacher's term alone; rewards are still computed and logged."""
    timeout_s: float = 300.0
    """How long one scoring request may take before it is tried on another teacher server
    (or again); a teacher that answers none of two tries stops the run, naming it."""
    max_concurrent: int = 8
    """Scoring requests in flight at once, over all teacher servers."""

    @property
    def enabled(self) -> bool:
        return bool(self.base_url or self.base_urls)

    @property
    def urls(self) -> list[str]:
        return list(self.base_urls) or ([self.base_url] if self.base_url else [])

    def validate(self) -> None:
        if not self.enabled:
            require(
                self.rewards,
                "distill.rewards",
                self.rewards,
                "false means pure distillation: set distill.base_url (the teacher) too",
            )
            return
        require(
            not (self.base_url and self.base_urls),
            "distill.base_url/base_urls",
            (self.base_url, self.base_urls),
            "set one: base_url for one teacher server, base_urls for several",
        )
        check_server_urls(self.urls, "distill.base_urls" if self.base_urls else "distill.base_url")
        require(self.coef > 0, "distill.coef", self.coef)
        require(self.timeout_s > 0, "distill.timeout_s", self.timeout_s)
        require(self.max_concurrent >= 1, "distill.max_concurrent", self.max_concurrent)
