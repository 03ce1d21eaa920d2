"""Serving a model to evaluate or query it: the vf-vllm flags it needs and the name clients use.

Sweeps and predictions take a model the way users name it anywhere else: the embedded short
name, a model directory, a Hugging Face id, or a LoRA adapter directory (what training leaves in
`output_dir/final`). An adapter is served on top of its base model with vLLM's LoRA support
(`--enable-lora --lora-modules NAME=DIR`; it works on vLLM's CPU backend too), so nothing has to
be merged first; requests then ask for NAME. A server that is already running is used as is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# The LoRA ranks vLLM 0.32 accepts for --max-lora-rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class ServedModel:
    """How to serve a model: vf-vllm's `--model`, the extra flags it needs, and the model name
    requests must carry."""

    model: str
    name: str
    server_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    """A running server: the OpenAI base URL and the model name to request."""

    base_url: str
    model: str


def is_adapter(model: str | Path) -> bool:
    """Whether `model` is a PEFT adapter directory (it has adapter_config.json)."""
    return (Path(model).expanduser() / "adapter_config.json").is_file()


def lora_rank_limit(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that fits an adapter of `rank`."""
    for limit in VLLM_LORA_RANKS:
        if limit >= rank:
            return limit
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank {limit}")


def served_model(model: str, name: str | None = None) -> ServedModel:
    """What serving `model` takes. `name` is what clients call it (default: `model` as given,
    as vf-vllm does); for an adapter directory the base model named in its adapter_config.json
    is served and the adapter is added as the LoRA module `name`."""
    name = name or model
    if not is_adapter(model):
        return ServedModel(model, name, ("--served-model-name", name))
    adapter = Path(model).expanduser().resolve()
    config = json.loads((adapter / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}/adapter_config.json names no base_model_name_or_path")
    rank = max([int(config.get("r", 8)), *map(int, (config.get("rank_pattern") or {}).values())])
    flags = ("--enable-lora", "--lora-modules", f"{name}={adapter}")
    return ServedModel(base, name, (*flags, "--max-lora-rank", str(lora_rank_limit(rank))))


@contextmanager
def serve(
    model: str,
    *,
    name: str | None = None,
    base_url: str | None = None,
    server_args: Sequence[str] = (),
    log_path: str | Path | None = None,
) -> Iterator[Endpoint]:
    """An endpoint serving `model` for the duration of the block.

    With `base_url` the server is already running and serves the model as `name` (default:
    `model`). Otherwise vf-vllm starts as a child process with `served_model(model, name)`'s
    flags plus `server_args` (e.g. `--dtype float32 --enforce-eager`), and stops afterwards.
    """
    if base_url is not None:
        yield Endpoint(base_url, name or model)
        return
    from rlvr.server.process import VLLMServer

    served = served_model(model, name)
    extra = [*served.server_args, *server_args]
    with VLLMServer(served.model, extra_args=extra, log_path=log_path) as server:
        yield Endpoint(server.base_url, served.name)
