"""Serving a model to evaluate or query it: the vf-vllm flags it needs and the name clients use.
A model is named as anywhere else (short name, directory, Hugging Face id, LoRA adapter
directory); an adapter is served on its base with vLLM's LoRA, or merged once into the cache
when vLLM cannot apply it. Design: docs/weight-transfer.md#serving-a-trained-adapter.
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
    from rlvr.atomic import made_once
    from rlvr.model.merge import merge_adapter
    from rlvr.model.names import cache_root

    weights = sorted(adapter.glob("adapter_model.*"))
    stamp = "".join(f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights)
    key = hashlib.sha256(f"{adapter}|{stamp}".encode()).hexdigest()[:12]
    target = cache_root() / "merged" / f"{adapter.name}-{key}"
    with made_once(target):
        if not (target / "config.json").is_file():
            merge_adapter(adapter, target)
    return target


def served_model(model: str, name: str | None = None) -> ServedModel:
    """What serving `model` as `name` (default: `model`) takes: an adapter directory is served
    as the LoRA module `name` on its base, or as its merged copy where vLLM cannot apply it."""
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
    """An endpoint serving `model` for the block: the running server at `base_url`, or a
    vf-vllm child with `served_model(model, name)`'s flags plus `server_args`."""
    if base_url is not None:
        yield Endpoint(base_url, name or model)
        return
    from rlvr.server.process import VLLMServer

    served = served_model(model, name)
    extra = [*served.server_args, *server_args]
    with VLLMServer(served.model, extra_args=extra, log_path=log_path) as server:
        yield Endpoint(server.base_url, served.name)
