"""The exact check of a push: each parameter's fingerprint on the server equals what the trainer
sent, cast to the server's dtype and summed under the server's names.

A fingerprint is the exact integer sum of a tensor's elements read as their bit patterns, plus
float64 sum and sum of squares (for the error message). Bit sums are exact and add in any order,
so they add across vLLM's fused layers (q/k/v into qkv_proj), tensor-parallel shards and padded
rows (zero bits) alike, and one changed element changes them at any dtype and any step size.
The server fingerprints what its layers compute with (rlvr.server.worker_extension).
Design: docs/weight-transfer.md#the-exact-check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Fingerprint:
    """Exact bit sum (the judge) and float64 sum and sum of squares (what a person reads)."""

    bits: int
    total: float = 0.0
    squares: float = 0.0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(
            self.bits + other.bits, self.total + other.total, self.squares + other.squares
        )

    def describe(self) -> str:
        return f"bits {self.bits}, sum {self.total:.9g}, sum of squares {self.squares:.9g}"


@torch.no_grad()
def fingerprint(tensor: torch.Tensor) -> Fingerprint:
    """The fingerprint of `tensor` as it is stored (its own dtype)."""
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return Fingerprint(0)
    ints = flat.contiguous().view(_INT_OF_WIDTH[flat.element_size()])
    wide = flat.double()
    return Fingerprint(
        int(ints.sum(dtype=torch.int64)), float(wide.sum()), float(wide.square().sum())
    )


def to_wire(prints: dict[str, tuple[str, Fingerprint]]) -> dict[str, list]:
    """JSON-safe form of a server's fingerprints: name -> [dtype, bits, sum, sum of squares]."""
    return {n: [dtype, p.bits, p.total, p.squares] for n, (dtype, p) in prints.items()}


@dataclass(frozen=True)
class ServedWeights:
    """What one server holds: each parameter's dtype and fingerprint under vLLM's names, and
    how vLLM fuses Hugging Face modules (`packed`: fused name -> its parts)."""

    dtypes: dict[str, torch.dtype]
    prints: dict[str, Fingerprint]
    packed: dict[str, list[str]] = field(default_factory=dict)
    unchecked: frozenset[str] = frozenset()
    """Parameters whose shards do not add up to what was sent (replicated key-value heads)."""

    @classmethod
    def from_answers(cls, answers: list[dict]) -> ServedWeights:
        """Every worker's report added up (tensor-parallel shards add; a parameter every
        worker holds whole, such as a norm, counts once)."""
        dtypes: dict[str, torch.dtype] = {}
        prints: dict[str, Fingerprint] = {}
        unchecked = frozenset(n for a in answers for n in a.get("unchecked", []))
        for answer in answers:
            sharded = set(answer.get("sharded", []))
            for name, (dtype, bits, total, squares) in answer["params"].items():
                p = Fingerprint(int(bits), float(total), float(squares))
                if name in prints and name not in sharded:
                    continue
                prints[name] = prints[name] + p if name in prints else p
                dtypes[name] = getattr(torch, dtype)
        packed = dict(answers[0].get("packed", {})) if answers else {}
        return cls(dtypes, prints, packed, unchecked)

    @cached_property
    def fused(self) -> dict[str, str]:
        """A Hugging Face module name -> the fused vLLM module holding it."""
        return {part: whole for whole, parts in self.packed.items() for part in parts}

    def server_name(self, hf_name: str) -> str:
        """The server's parameter holding the Hugging Face parameter `hf_name`."""
        return ".".join(self.fused.get(p, p) for p in hf_name.split("."))


class Expected:
    """The trainer's side: fingerprints of the tensors a push sends, under the server's names
    and in its dtypes (`tap` them as they stream); `aliases` maps a tied parameter's other
    name to the name it is sent under (a tied output layer is the embedding)."""

    def __init__(self, served: ServedWeights, aliases: dict[str, str] | None = None):
        self.served = served
        self.aliases = aliases or {}
        self.prints: dict[str, Fingerprint] = {}

    def unknown(self, names: Iterable[str]) -> list[str]:
        """Of the Hugging Face `names`, those the server holds under no name of its own."""
        return [n for n in names if self.served.server_name(n) not in self.served.dtypes]

    def tap(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, Any]]:
        """Pass the stream through unchanged, fingerprinting each tensor on the way."""
        self.prints = {}
        for name, tensor in tensors:
            self._add(self.served.server_name(name), tensor)
            yield name, tensor
        for alias, name in self.aliases.items():
            target, source = self.served.server_name(alias), self.served.server_name(name)
            if target in self.served.dtypes and source in self.prints:
                self.prints[target] = self.prints[source]

    def _add(self, name: str, tensor: torch.Tensor) -> None:
        p = fingerprint(tensor.to(self.served.dtypes[name]))
        self.prints[name] = self.prints[name] + p if name in self.prints else p


LORA_TENSOR = re.compile(
    r"(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<part>[AB])(?:\.default)?\.weight"
)
"""A PEFT adapter tensor's name: the module it adapts and which of the two matrices."""


def lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    """Each LoRA layer's scaling (alpha / r, or rsLoRA's), by its PEFT module name."""
    return {
        name: module.scaling["default"]
        for name, module in model.named_modules()
        if isinstance(getattr(module, "scaling", None), dict) and "default" in module.scaling
    }


def adapter_expected(
    state: dict[str, torch.Tensor], scalings: dict[str, float], served: ServedWeights
) -> dict[str, Fingerprint]:
    """The trainer's side of an adapter push's check: each trained LoRA matrix as vLLM stores
    it (cast to the server's dtype, B then multiplied by its layer's scaling, which vLLM folds
    into B on loading), summed under the server's fused module names."""
    prints: dict[str, Fingerprint] = {}
    for name, tensor in state.items():
        match = LORA_TENSOR.fullmatch(name)
        if match is None:
            continue
        module, part = match["module"], match["part"].lower()
        served_name = f"{served.server_name(module)}.lora_{part}"
        held = tensor.to(served.dtypes.get(served_name, tensor.dtype))
        scaling = scalings.get(name.split(".lora_")[0], 1.0)
        if part == "b" and scaling != 1:
            held = held * scaling
        p = fingerprint(held)
        prints[served_name] = prints[served_name] + p if served_name in prints else p
    return prints


@dataclass(frozen=True)
class Mismatch:
    """One parameter the server does not hold as sent."""

    name: str
    sent: Fingerprint
    served: Fingerprint | None

    def describe(self) -> str:
        served = "missing" if self.served is None else self.served.describe()
        return f"{self.name}: sent {self.sent.describe()}; served {served}"


def mismatches(expected: dict[str, Fingerprint], served: ServedWeights) -> list[Mismatch]:
    """The parameters whose served fingerprint is not the one sent (exact: bit sums)."""
    return [
        Mismatch(name, sent, served.prints.get(name))
        for name, sent in expected.items()
        if name not in served.unchecked
        and (served.prints.get(name) is None or served.prints[name].bits != sent.bits)
    ]


def aliases(model: torch.nn.Module) -> dict[str, str]:
    """Each tied parameter's other names -> the name it is streamed under (the first)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            out[name] = first[id(param)]
        else:
            first[id(param)] = name
    return out


@dataclass(frozen=True)
class Verified:
    """One server's exact check of the push of weight `version`."""

    version: int
    seconds: float
    params: int
    failed: list[Mismatch]

    def metrics(self) -> dict[str, float]:
        return {
            "push/verify_seconds": self.seconds,
            "push/verified_params": float(self.params),
            "push/failed_params": float(len(self.failed)),
        }


def verified_metrics(checks: dict[int, Verified | None]) -> dict[str, float]:
    """Each server's exact-check metrics under `push/<i>/`, and their totals unprefixed."""
    done = {i: v.metrics() for i, v in checks.items() if v is not None}
    out = {k.replace("push/", f"push/{i}/", 1): x for i, m in done.items() for k, x in m.items()}
    for key in ("push/verify_seconds", "push/verified_params", "push/failed_params"):
        if done:
            out[key] = sum(m[key] for m in done.values())
    return out
