"""After a reload, only the layers that share a parameter and were not rebuilt are processed
again (a tied output layer; not the embedding the reload already rebuilt)."""

from __future__ import annotations

import torch

from rlvr.server.held_weights import (
    KERNEL_PRINTS,
    kernel_records,
    record_kernel_inputs,
    reprocess_shared,
)


class Rebuilds:
    """A quant method that records which layers it processed (and rebuilds their record)."""

    def __init__(self, log: list[str], name: str):
        self.log, self.name = log, name

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.log.append(self.name)
        record_kernel_inputs(layer)


def tied_model(log: list[str]) -> torch.nn.Module:
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.other = torch.nn.Linear(4, 4)
    model.head.weight = model.embed.weight
    for name in ("embed", "head", "other"):
        layer = getattr(model, name)
        layer.quant_method = Rebuilds(log, name)
        record_kernel_inputs(layer)
    return model


def test_only_the_shared_layer_the_reload_skipped_is_processed_again():
    log: list[str] = []
    model = tied_model(log)
    before = kernel_records(model)
    record_kernel_inputs(model.embed)  # what the reload rebuilds: the layer that got weights
    record_kernel_inputs(model.other)
    assert reprocess_shared(model, before) == 1 and log == ["head"]
    assert getattr(model.head, KERNEL_PRINTS) is not before[id(model.head)]


def test_nothing_is_processed_again_without_shared_parameters():
    log: list[str] = []
    model = tied_model(log)
    model.head.weight = torch.nn.Parameter(model.embed.weight.detach().clone())
    assert reprocess_shared(model, kernel_records(model)) == 0 and log == []
