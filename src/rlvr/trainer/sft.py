"""Supervised fine-tuning: a warm-up on chat transcripts or filtered rollouts before GRPO.

Built from the GRPO trainer's parts (policy loader, optimizer step, checkpoints, run logger).
One step takes the next `train.batch_size` examples of the shuffled epoch stream (the same on
every rank), sums each micro-batch's negative log-likelihood over assistant tokens divided by
the step's global loss-token count (so the layout cannot change the gradient), and takes one
clipped optimizer step. Which tokens get loss is `rlvr.data.sft_rows`'s business.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.batch import MicroBatch, Sample
from rlvr.config import SFTConfig, save_config, to_yaml
from rlvr.data.sft_rows import (
    Conversation,
    DataError,
    DataStats,
    EpochOrder,
    read_conversations,
    tokenize,
)
from rlvr.layout.micro_batches import collate, rank_micro_batches
from rlvr.model.policy import load_policy, save_final
from rlvr.reasoning_vocab.hooks import PolicyHooks
from rlvr.trainer.cadence import Cadence, run_steps
from rlvr.trainer.checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from rlvr.trainer.logprobs import sequence_scores
from rlvr.trainer.loss import normalised_loss
from rlvr.trainer.memory import Budget, fit_policy
from rlvr.trainer.metrics import RunLogger
from rlvr.trainer.optimizer import Optimization, make_accelerator


def nll_sum(
    model: torch.nn.Module, mb: MicroBatch, hooks: PolicyHooks | None = None
) -> torch.Tensor:
    """Summed negative log-likelihood of the micro-batch's loss tokens (not averaged: the
    caller divides by the step's global count). With a reasoning vocabulary's `hooks`, the
    likelihood of the text: a thinking token counts as itself or its reasoning copy."""
    mask = hooks.logit_mask(mb, fold=True) if hooks is not None else None
    return -(sequence_scores(model, mb, mask_logits=mask).logprobs * mb.loss_mask).sum()


def split_conversations(
    cfg: SFTConfig,
) -> tuple[list[Conversation], list[Conversation]]:
    """Training and validation conversations, checked (before any model is loaded)."""
    data = cfg.data
    train = read_conversations(data.train_files, data)
    validation = read_conversations([data.validation_file], data) if data.validation_file else []
    if data.validation_holdout:
        if data.validation_holdout >= len(train):
            raise DataError(
                f"data.validation_holdout={data.validation_holdout} leaves no training rows "
                f"(the training files hold {len(train)})"
            )
        train, validation = train[: -data.validation_holdout], train[-data.validation_holdout :]
    if data.max_examples is not None:
        train = train[: data.max_examples]
    return train, validation


def total_steps(cfg: SFTConfig, num_examples: int) -> int:
    """train.max_steps, or as many steps as `train.epochs` passes take (a last, partial
    batch is filled up with the first rows of the next pass's order)."""
    t = cfg.train
    return t.max_steps or math.ceil(t.epochs * num_examples / t.batch_size)


class SFTTrainer:
    """Build with a config, then `run()`. `run(stop_after=k)` stops after k steps with a
    checkpoint, as an interrupted run would (used by the resume test)."""

    def __init__(self, config: SFTConfig):
        config.validate()
        self.cfg = config
        self.history: list[dict[str, float]] = []
        self.logger: RunLogger | None = None

    # ---- set-up -----------------------------------------------------------------------

    def setup(self) -> None:
        from accelerate.utils import set_seed

        cfg = self.cfg
        self.accelerator = acc = make_accelerator(cfg.distributed.timeout_s)
        self.rank, self.world = acc.process_index, acc.num_processes
        set_seed(cfg.seed)
        train, validation = split_conversations(cfg)  # bad data fails before the model loads
        self.out = Path(cfg.output_dir)
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
            print(f"# rlvr SFT config (saved to {self.out / 'config.yaml'})\n{to_yaml(cfg)}")
        tokens = cfg.train.micro_batch_size * cfg.data.max_seq_len
        knob = "train.micro_batch_size x data.max_seq_len"
        budget = Budget(tokens, knob, cfg.data.max_seq_len, "data.max_seq_len")
        policy = load_policy(cfg.model, cfg.lora, acc)
        fit_policy(policy, cfg.model, cfg.lora, budget, acc)
        self.tokenizer, self.pad_id = policy.tokenizer, policy.pad_id
        self.reasoning_vocab, self.hooks = policy.reasoning_vocab, policy.hooks
        stats = self._tokenize(train, validation)
        self.opt = Optimization(
            acc, policy.model, cfg.optim, self.total_steps, cfg.train.micro_batch_size
        )
        self.model = self.opt.model
        resume = resolve_resume(cfg.checkpoint.resume, cfg.output_dir)
        state = load_checkpoint(acc, resume, self.model, self.opt.deepspeed) if resume else {}
        self.start_step = int(state.get("step", 0))
        self.data_position = int(state.get("data_position", 0))
        self.logger = RunLogger(
            cfg, acc.is_main_process, self.start_step, state.get("wandb_run_id")
        )
        self._report_data(*stats)
        if resume:
            self.logger.print(f"resumed from {resume} at step {self.start_step}")

    def _tokenize(
        self, train: list[Conversation], validation: list[Conversation]
    ) -> tuple[DataStats, DataStats | None]:
        """Token samples of both splits, the epoch order and the step count."""
        cfg = self.cfg
        self.train_set, train_stats = tokenize(train, self.tokenizer, cfg.data)
        self.val_set, val_stats = tokenize(validation, self.tokenizer, cfg.data)
        if not self.train_set:
            summary = train_stats.summary("train", cfg.data.max_seq_len)
            raise DataError(f"no training example is left: {summary}")
        self.order = EpochOrder(len(self.train_set), cfg.data.shuffle_seed)
        self.total_steps = total_steps(cfg, len(self.train_set))
        return train_stats, val_stats if validation else None

    def _report_data(self, train: DataStats, validation: DataStats | None) -> None:
        """Print and log what tokenization kept, cut and dropped."""
        max_len = self.cfg.data.max_seq_len
        metrics = train.metrics("train")
        self.logger.print(train.summary("train", max_len))
        if validation is not None:
            metrics.update(validation.metrics("val"))
            self.logger.print(validation.summary("validation", max_len))
        for split, stats in (("train", train), ("validation", validation)):
            if stats is not None and stats.dropped and self.accelerator.is_main_process:
                self.logger.warn(f"{stats.dropped} {split} examples dropped as too long")
        self.logger.log(self.start_step, metrics)
        self.logger.print(
            f"{self.total_steps} steps of {self.cfg.train.batch_size} sequences "
            f"({self.total_steps * self.cfg.train.batch_size / len(self.train_set):.2f} epochs)"
        )

    # ---- the loop ---------------------------------------------------------------------

    def run(self, stop_after: int | None = None) -> list[dict[str, float]]:
        """Train to the last step (or `stop_after` steps); returns each step's metrics."""
        self.setup()
        cadence = Cadence(
            total_steps=self.total_steps,
            eval_every=self.cfg.train.eval_every,
            save_every=self.cfg.checkpoint.every,
            eval_at_start=True,  # (without a validation set, evaluate does nothing)
            eval_at_end=True,
        )
        try:
            return run_steps(self, cadence, self.start_step, stop_after)
        finally:
            if self.logger is not None:
                self.logger.close()

    def save_final(self) -> Path:
        """The trained model (or adapter) beside the checkpoints, as the GRPO trainer saves it."""
        lora = self.cfg.lora.enabled
        args = (self.accelerator, self.model, self.tokenizer, self.out, lora, self.reasoning_vocab)
        final = save_final(*args)
        self.logger.print(f"final {'adapter' if lora else 'model'}: {final}")
        return final

    def train_step(self, step: int) -> dict[str, float]:
        began = time.perf_counter()
        batch_size = self.cfg.train.batch_size
        examples = [self.train_set[i] for i in self.order.take(self.data_position, batch_size)]
        samples = [e.sample for e in examples]
        global_tokens = sum(s.num_loss_tokens for s in samples)
        lr = self.opt.lr
        self.model.train()
        nll = self._forward(samples, global_tokens)
        grad_norm = self.opt.step(global_tokens > 0)
        self.data_position += batch_size
        seconds = time.perf_counter() - began
        metrics = {
            "train/loss": nll / max(global_tokens, 1),
            "train/learning_rate": lr,
            "train/grad_norm": grad_norm,
            "train/epoch": self.data_position / len(self.train_set),
            "train/tokens_per_s": sum(len(s) for s in samples) / seconds,
            "train/loss_tokens": global_tokens,
            "train/truncated": sum(e.truncated for e in examples),
            "time/step": seconds,
        }
        metrics.update(self.hooks.weight_metrics(self.accelerator.unwrap_model(self.model)))
        self.logger.log(step + 1, metrics)
        self.logger.print(
            f"step {step + 1}/{self.total_steps} | epoch {metrics['train/epoch']:.2f} | "
            f"loss {metrics['train/loss']:.4f} | lr {lr:.2e} | grad norm {grad_norm:.3g} | "
            f"{metrics['train/tokens_per_s']:.0f} tok/s | {seconds:.2f} s"
        )
        return metrics

    def _forward(self, samples: list[Sample], global_tokens: int, train: bool = True) -> float:
        """Run this rank's micro-batches of `samples` (with backward when training); return
        the summed NLL over all ranks."""
        train_cfg = self.cfg.train
        mine = rank_micro_batches(
            samples,
            self.rank,
            self.world,
            train_cfg.micro_batch_size,
            self.pad_id,
            train_cfg.packing,
        )
        total = torch.zeros((), device=self.accelerator.device)
        for i, chunk in enumerate(mine):
            mb = collate(chunk, self.pad_id).to(self.accelerator.device)
            if not train:
                total += nll_sum(self.model, mb, self.hooks)
                continue
            last = i == len(mine) - 1
            with self.opt.accumulating(last):
                loss_sum = nll_sum(self.model, mb, self.hooks)
                self.opt.backward(normalised_loss(loss_sum, global_tokens, self.world), last)
            total += loss_sum.detach()
        return float(self.accelerator.reduce(total, "sum"))

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float] | None:
        """val/loss: the per-token NLL of the validation examples' assistant tokens."""
        if not self.val_set:
            return None
        began = time.perf_counter()
        samples = [e.sample for e in self.val_set]
        tokens = sum(s.num_loss_tokens for s in samples)
        self.model.eval()
        metrics = {
            "val/loss": self._forward(samples, tokens, train=False) / tokens,
            "val/time": time.perf_counter() - began,
        }
        self.logger.log(step, metrics)
        self.logger.print(f"validation at step {step}: loss {metrics['val/loss']:.4f}")
        return metrics

    # ---- checkpoints ------------------------------------------------------------------

    def save(self, step: int) -> Path:
        state: dict[str, Any] = {
            "step": step,
            "data_position": self.data_position,
            "wandb_run_id": self.logger.run_id,
        }
        path = save_checkpoint(
            self.accelerator, self.cfg.output_dir, state, self.cfg.checkpoint.keep_last
        )
        self.logger.print(f"checkpoint saved: {path}")
        return path
