"""The optimizer side of a training step, for every trainer (GRPO and SFT).

AdamW and an LR schedule, prepared by accelerate for a single process, DDP or DeepSpeed
ZeRO-3. A step accumulates gradients over a variable number of micro-batches (the callers
normalise each micro-batch's loss by the step's global token count, so nothing here divides),
then takes one clipped optimizer step. DeepSpeed's engine is driven directly: accelerate would
step it after every backward.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Any

import torch

from rlvr.config import OptimConfig
from rlvr.trainer.checkpoint import keep_trainable_only


def make_accelerator(timeout_s: float) -> Any:
    """The Accelerator for a trainer, with the process-group timeout of `distributed.timeout_s`.

    Under `accelerate launch` without CUDA the process group is pinned to gloo: accelerate
    finds no accelerator backend on a CPU machine and then counts DeepSpeed's ranks as one
    process (every rank believes it is rank 0 of 1), although DeepSpeed's CPU accelerator
    has joined them in a gloo group."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s)}
    launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
    if launched and not torch.cuda.is_available():
        kwargs["backend"] = "gloo"
    return Accelerator(kwargs_handlers=[InitProcessGroupKwargs(**kwargs)])


class Optimization:
    """Build after the model is loaded; `model` is then the prepared (wrapped) model."""

    def __init__(
        self,
        accelerator: Any,
        model: torch.nn.Module,
        cfg: OptimConfig,
        total_steps: int,
        micro_batch_size: int,
    ):
        from accelerate.utils import DistributedType
        from transformers import get_scheduler

        self.accelerator = acc = accelerator
        self.cfg = cfg
        self.deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        self.params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.lr,
            betas=tuple(cfg.betas),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        name = cfg.scheduler
        if name == "constant" and cfg.warmup_steps:
            name = "constant_with_warmup"
        # The scheduler stays outside accelerate.prepare: its wrapper steps it once per process
        # per call (meant for data-parallel dataloaders), which would run it world_size times
        # faster. It is registered so checkpoints still carry it.
        self.scheduler = get_scheduler(
            name, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=total_steps
        )
        if self.deepspeed:
            ds_config = acc.state.deepspeed_plugin.deepspeed_config
            # DeepSpeed's batch bookkeeping only has to be consistent: the trainers accumulate
            # a variable number of micro-batches per optimizer step themselves.
            ds_config["train_micro_batch_size_per_gpu"] = micro_batch_size
            ds_config["train_batch_size"] = micro_batch_size * acc.num_processes
            ds_config["gradient_accumulation_steps"] = 1
            ds_config["gradient_clipping"] = cfg.max_grad_norm
        self.model, self.optimizer = acc.prepare(model, optimizer)
        acc.register_for_checkpointing(self.scheduler)
        keep_trainable_only(acc)

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return self.scheduler.get_last_lr()[0]

    def accumulating(self, last: bool):
        """Context for one micro-batch's backward: DDP skips the gradient all-reduce on all
        but the step's last micro-batch."""
        acc = self.accelerator
        if last or self.deepspeed or acc.num_processes == 1:
            return contextlib.nullcontext()
        return acc.no_sync(self.model)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        if self.deepspeed:
            self.model.set_gradient_accumulation_boundary(last)
            self.model.backward(loss)
        else:
            self.accelerator.backward(loss)

    def step(self, has_gradient: bool) -> float:
        """One clipped optimizer step; returns the gradient norm before clipping. Skipped when
        no token had loss (Adam would still move the weights on momentum alone); the LR
        schedule advances either way."""
        grad_norm = 0.0
        if has_gradient:
            if self.deepspeed:
                self.model.step()
                grad_norm = float(self.model.get_global_grad_norm() or 0.0)
            else:
                max_norm = self.cfg.max_grad_norm or float("inf")
                grad_norm = float(self.accelerator.clip_grad_norm_(self.params, max_norm))
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm
