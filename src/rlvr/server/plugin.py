"""vLLM general plugin (entry point group `vllm.general_plugins`): runs in every vLLM process,
so our `cpu` weight-transfer engine exists on CPU workers before the model loads."""

from __future__ import annotations


def register() -> None:
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from rlvr.server import cpu_engine

    for factory, engine in (
        (WeightTransferEngineFactory, cpu_engine.CPUWeightTransferEngine),
        (WeightTransferTrainerFactory, cpu_engine.CPUTrainerWeightTransferEngine),
    ):
        try:
            factory.register_engine(cpu_engine.BACKEND, engine)
        except ValueError:  # already registered: plugins can load more than once per process
            pass
