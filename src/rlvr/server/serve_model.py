"""Serving a model to evaluate or query it: the vf-vllm flags it needs and the name clients use.

Sweeps and predictions take a model the way users name it anywhere else: the embedded short
name, a model directory, a Hugging Face id, or a LoRA adapter directory (what training leaves in
`output_dir/final`). An adapter is served on top of its base model with vLLM's LoRA support
(`--enable-lora --lora-modules NAME=DIR`; it works on vLLM's CPU backend too), so nothing has to
be merged first; requests then ask for NAME. vLLM's LoRA covers the attention and MLP
projections only: an adapter that also trains `lm_head` or the embeddings is merged once into
the cache (RLVR_CACHE) and that copy is served under NAME instead. A server that is already
running is used as is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rlvr.weight_sync.vllm_lora import adapter_rank, lora_rank_limit, lora_serving_problem


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


def merged_copy(adapter: Path) -> Path:
    """The adapter merged into its base, made once per adapter version under RLVR_CACHE."""
    from rlvr.model.merge import merge_adapter
    from rlvr.model.names import cache_root

    weights = sorted(adapter.glob("adapter_model.*"))
    stamp = "".join(f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights)
    key = hashlib.sha256(f"{adapter}|{stamp}".encode()).hexdigest()[:12]
    target = cache_root() / "merged" / f"{adapter.name}-{key}"
    if not (target / "config.json").is_file():
        merge_adapter(adapter, target)
    return target


def served_model(model: str, name: str | None = None) -> ServedModel:
    """What serving `model` takes. `name` is what clients call it (default: `model` as given,
    as vf-vllm does). For an adapter directory the base model named in its adapter_config.json
    is served and the adapter added as the LoRA module `name`, or, for an adapter vLLM cannot
    apply (`rlvr.weight_sync.vllm_lora`), its merged copy is served as `name` (merging it here,
    once)."""
    name = name or model
    if not is_adapter(model):
        return ServedModel(model, name, ("--served-model-name", name))
    adapter = Path(model).expanduser().resolve()
    config = json.loads((adapter / "adapter_config.json").read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}/adapter_config.json names no base_model_name_or_path")
    if lora_serving_problem(config) is not None:
        return ServedModel(str(merged_copy(adapter)), name, ("--served-model-name", name))
    flags = ("--enable-lora", "--lora-modules", f"{name}={adapter}")
    rank = lora_rank_limit(adapter_rank(config))
    return ServedModel(base, name, (*flags, "--max-lora-rank", str(rank)))


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
