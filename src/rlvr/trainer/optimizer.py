"""The optimizer side of a training step, for every trainer (GRPO and SFT).

AdamW and an LR schedule, prepared by accelerate (single process, DDP or DeepSpeed ZeRO-3,
whose engine is driven directly). A step accumulates gradients over any number of micro-batches
(callers normalise each loss by the step's token count), then takes one clipped optimizer step.
A non-finite loss or gradient norm raises `NonFiniteStepError` instead of stepping: one AdamW
step on NaN gradients would make every trainable tensor NaN.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
from datetime import timedelta
from typing import Any

import torch

from rlvr.config import OptimConfig
from rlvr.trainer.checkpoint import keep_trainable_only

log = logging.getLogger(__name__)


class NonFiniteStepError(FloatingPointError):
    """A step's loss or gradient norm is NaN or infinite; raised before the optimizer step,
    so the weights, the optimizer state and the last checkpoint are those of the step before
    (`stepped`: a DeepSpeed configuration without ZeRO, which applies such an update)."""

    def __init__(self, step: int, what: str, stepped: bool = False) -> None:
        weights = (
            "DeepSpeed applied the update (this configuration does not skip such steps), so "
            "the weights in memory are damaged; "
            if stepped
            else "the optimizer did not step (the weights are "
            + (f"those after step {step - 1}); " if step > 1 else "the initial ones); ")
        )
        super().__init__(
            f"step {step}: {what}; {weights}the run stops here and no checkpoint is written, "
            "so the last checkpoint is intact: resume from it with checkpoint.resume=auto "
            "after fixing the cause (docs/troubleshooting.md: 'Non-finite rewards, loss or "
            "gradient norm')"
        )
        self.step = step


def lr_factor(step: int, scheduler: str, warmup_steps: int, total_steps: int) -> float:
    """The multiple of optim.lr that optimizer step `step` (0-based) uses.

    Warm-up rises linearly to 1 and its first step is already above 0 (1/warmup_steps):
    a step at learning rate 0 moves nothing but still spends a batch. After warm-up:
    constant, linear to 0, or half a cosine to 0, both reaching 0 one step after the last.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    if scheduler == "linear":
        return max(0.0, 1.0 - progress)
    if scheduler == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return 1.0


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
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(**kwargs)])
    ignore_gradient_accumulation(accelerator)
    return accelerator


def ignore_gradient_accumulation(accelerator: Any) -> None:
    """Keep accelerate from dividing every loss by its gradient-accumulation steps.

    The trainers accumulate a step's micro-batches themselves, each loss already divided by
    the step's token count; accelerate's `backward` would divide again by
    `gradient_accumulation_steps`, which it reads from a leftover
    `ACCELERATE_GRADIENT_ACCUMULATION_STEPS` (4: gradients x 0.25, clipping 4x looser,
    `grad_norm` misreported). DeepSpeed's engine is set to 1 in `Optimization` instead."""
    from accelerate.utils import DistributedType

    steps = accelerator.gradient_accumulation_steps
    if steps == 1 or accelerator.distributed_type == DistributedType.DEEPSPEED:
        return
    log.warning(
        "ignoring gradient_accumulation_steps=%s (ACCELERATE_GRADIENT_ACCUMULATION_STEPS=%s "
        "in the environment): the trainer accumulates each step's micro-batches itself, "
        "normalised by the step's token count; unset the variable to silence this warning",
        steps,
        os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS"),
    )
    accelerator.gradient_accumulation_steps = 1


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

        self.accelerator = acc = accelerator
        self.cfg = cfg
        self.deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named_params]
        optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.lr,
            betas=tuple(cfg.betas),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
        )
        # The scheduler stays outside accelerate.prepare: its wrapper steps it once per process
        # per call (meant for data-parallel dataloaders), which would run it world_size times
        # faster. It is registered so checkpoints still carry it.
        factor = functools.partial(
            lr_factor,
            scheduler=cfg.scheduler,
            warmup_steps=cfg.warmup_steps,
            total_steps=total_steps,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
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

    @property
    def next_step(self) -> int:
        """The number (1-based, as logged) of the optimizer step being accumulated: the LR
        schedule advances once per step, also across a resume."""
        return self.scheduler.last_epoch + 1

    def check_loss(self, loss: float) -> None:
        """Raise `NonFiniteStepError` when the step's loss (summed over micro-batches and
        ranks, so every rank decides alike) is not finite."""
        if not math.isfinite(loss):
            raise NonFiniteStepError(self.next_step, f"the loss is {loss}")

    def step(self, has_gradient: bool) -> float:
        """One clipped optimizer step; returns the gradient norm before clipping. Skipped when
        the step's loss has no gradient (`rlvr.trainer.step.has_gradient`: Adam would still
        move the weights on momentum alone); the LR schedule advances either way. A gradient
        norm that is not finite raises `NonFiniteStepError` before the weights move (see
        `_clipped_norm`, `_deepspeed_step`)."""
        grad_norm = 0.0
        if has_gradient:
            if self.deepspeed:
                grad_norm = self._deepspeed_step()
            else:
                grad_norm = self._clipped_norm()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return grad_norm

    def _clipped_norm(self) -> float:
        """The global gradient norm, checked, then the gradients clipped to max_grad_norm.

        The norm is checked before clipping: clipping by a NaN norm would make every gradient
        NaN and hide which parameter was first. Gradients are the same on every rank here (DDP
        has all-reduced them), so every rank raises alike. Under accelerate's fp16 loss scaler
        an overflow is the scaler's to handle: it skips the step and lowers the scale."""
        self.accelerator.unscale_gradients()
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        norm = torch.nn.utils.get_total_norm(grads)
        if not torch.isfinite(norm) and self.accelerator.scaler is None:
            raise NonFiniteStepError(self.next_step, self._non_finite_gradients(float(norm)))
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.cfg.max_grad_norm, norm)
        return float(norm)

    def _non_finite_gradients(self, norm: float) -> str:
        """What was not finite: the norm and the first parameter whose gradient has a NaN or
        an infinity (looked for only now, on the way to an error)."""
        first = next(
            (
                n
                for n, p in self.named_params
                if p.grad is not None and not torch.isfinite(p.grad).all()
            ),
            None,
        )
        if first is None:
            return f"the gradient norm is {norm} (every gradient is finite: their norm overflowed)"
        return f"the gradient norm is {norm} (first non-finite gradient: {first})"

    def _deepspeed_step(self) -> float:
        """DeepSpeed's step, which computes the global gradient norm (all-reduced over ranks,
        so every rank decides alike) and, under ZeRO and its bf16 optimizer, skips the update
        when the norm is not finite (`was_step_applied()` is then False): raised here, after
        the skipped step. Under fp16 a skipped step is the loss scaler's overflow handling."""
        self.model.step()
        norm = float(self.model.get_global_grad_norm() or 0.0)
        applied = self.model.was_step_applied()
        if self.model.fp16_enabled() or (applied and math.isfinite(norm)):
            return norm  # fp16: a skipped step is the loss scaler's own overflow handling
        raise NonFiniteStepError(
            self.next_step,
            f"the gradient norm is {norm} (DeepSpeed's report for a NaN or infinite one)",
            stepped=applied,
        )
