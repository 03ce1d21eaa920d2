"""An environment's own sampling defaults that survive vf-eval and every other caller.

verifiers 0.1.14 keeps an environment's defaults in `env.sampling_args`, but lets the caller's
arguments replace them (`Environment.generate`: `defaults.update(sampling_args)`), and vf-eval
sends `max_tokens: None` when `-t` is not given. So `sampling_args={"max_tokens": N}` alone is
erased, and vLLM lets a small model ramble to the end of its context. `DefaultSampling` fills
the defaults back in where every model request passes (`get_model_response`), for each field
the caller left out or set to None; a value the caller did set always wins. Trainers that read
`env.sampling_args` themselves (rlvr's) see the same defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def fill_unset(args: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`args` with each field it leaves out or sets to None taken from `defaults`;
    `extra_body` is filled the same way, key by key."""
    merged = dict(args or {})
    for key, value in defaults.items():
        if key == "extra_body":
            merged[key] = fill_unset(merged.get(key), value)
        elif merged.get(key) is None:
            merged[key] = value
    return merged


class DefaultSampling:
    """Mixin for a verifiers Environment (listed before it among the bases): every model
    request takes the environment's `sampling_args` for the fields its caller left unset."""

    sampling_args: dict[str, Any]

    async def get_model_response(
        self,
        state: Any,
        prompt: Any,
        client: Any = None,
        model: str | None = None,
        tool_defs: Any = None,
        sampling_args: Mapping[str, Any] | None = None,
    ) -> Any:
        """verifiers' request, with the defaults filled into the arguments it would use (the
        caller's, else the rollout's)."""
        args = fill_unset(sampling_args or state["sampling_args"], self.sampling_args)
        return await super().get_model_response(  # type: ignore[misc]
            state, prompt, client, model, tool_defs, args
        )
