"""vLLM general plugin (entry point group `vllm.general_plugins`): runs in every vLLM process,
so the `gloo` weight-transfer engine exists on CPU workers before the model loads."""

from __future__ import annotations


def register() -> None:
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from rlvr.server import gloo_engine

    for factory, engine in (
        (WeightTransferEngineFactory, gloo_engine.GlooWeightTransferEngine),
        (WeightTransferTrainerFactory, gloo_engine.GlooTrainerWeightTransferEngine),
    ):
        try:
            factory.register_engine(gloo_engine.BACKEND, engine)
        except ValueError:  # already registered: plugins can load more than once per process
            pass
