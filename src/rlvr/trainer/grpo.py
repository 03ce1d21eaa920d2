"""The GRPO training loop: set-up, then per step batch -> forward/backward -> optimizer -> push.

`Trainer.train_step` takes the step's `TrainBatch` from the rollout worker, accumulates this
rank's micro-batches (laid out by `rlvr.layout`), takes one optimizer step, pushes the new
weights as version step+1 (each server's copy checked exactly) and logs;
`rlvr.trainer.cadence.run_steps` evaluates and checkpoints. The module reads top to bottom,
set-up to close; the design of a step is in docs/architecture.md#data-flow-of-a-training-step.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlvr.batch import MicroBatch, StepBatch, TrainBatch
from rlvr.config import Config, ConfigError, save_config, to_yaml
from rlvr.layout.layout_check import check_shared_layouts
from rlvr.layout.micro_batches import largest_micro_batch
from rlvr.layout.plan import plan_step
from rlvr.layout.prefix_tree import SplitCost
from rlvr.model.policy import load_model, load_policy, reference_mode, resolve_dtype, save_final
from rlvr.reasoning_vocab.hooks import MaskLogits, PolicyHooks
from rlvr.rollouts.worker import RolloutWorker
from rlvr.trainer.cadence import Cadence, run_steps
from rlvr.trainer.checkpoint import load_checkpoint, load_in_flight, resolve_resume, save_checkpoint
from rlvr.trainer.cores import pin_to_cores
from rlvr.trainer.logprobs import sequence_scores, token_logprobs
from rlvr.trainer.loss import StepStats, merge_ranks, step_normaliser, summarise
from rlvr.trainer.memory import GIB, Budget, fit_policy, peak_bytes, reset_peak, split_cost
from rlvr.trainer.metrics import (
    Laps,
    RunLogger,
    distill_wait,
    mismatch_warning,
    split_warning,
    step_line,
)
from rlvr.trainer.optimizer import Optimization, make_accelerator
from rlvr.trainer.push_probes import Pushed, PushProbes
from rlvr.trainer.rollout_setup import close_rollouts, load_env, start_worker
from rlvr.trainer.step import Trained, has_gradient, micro_batch_loss
from rlvr.trainer.train_batch import build_train_batch
from rlvr.weight_sync.connect import Connection, connect
from rlvr.weight_sync.fingerprint import verified_metrics
from rlvr.weight_sync.probe import WeightsNotServedError

if TYPE_CHECKING:
    from accelerate import Accelerator

    from rlvr.model.policy import Policy
    from rlvr.rollouts.servers import ServerPool
    from rlvr.weight_sync.fleet import FleetPush

log = logging.getLogger(__name__)


class Trainer:
    """Build with a config (and optionally an environment object instead of `env.id`), then
    `run()`. `run(stop_after=k)` stops after k steps with a checkpoint, as an interrupted run
    would (used by the resume test)."""

    def __init__(self, config: Config, env: Any = None):
        config.validate()
        self.cfg = config
        self.env = env
        self.history: list[dict[str, float]] = []
        # built by setup(), in this order
        self.accelerator: Accelerator | None = None
        self.ds = False  # DeepSpeed (ZeRO-3) wraps the model
        self.rank, self.world = 0, 1
        self.out = Path(config.output_dir)
        self.policy: Policy | None = None
        self.model: torch.nn.Module | None = None  # wrapped (DDP, DeepSpeed) once `opt` is made
        self.tokenizer: Any = None
        self.pad_id = 0
        self.hooks = PolicyHooks()
        self.split_cost = SplitCost()  # what a folded micro-batch's plan charges
        self.ref_model: torch.nn.Module | None = None  # full fine-tuning's frozen reference
        self.opt: Optimization | None = None
        self.in_flight: list[StepBatch] = []  # batches a resumed checkpoint had generating
        self.start_step = self.data_position = 0
        self.curriculum_state: dict[int, Any] | None = None  # after the last batch trained
        self.logger: RunLogger | None = None
        self.connection: Connection | None = None
        self.weights: FleetPush | None = None  # how weights reach the servers, once connected
        self.pool: ServerPool | None = None
        self.probes: PushProbes | None = None
        self.worker: RolloutWorker | None = None  # rank 0
        self._warned_split = False  # a step's split sequence-level ratio was told

    # ---- set-up ---------------------------------------------------------------------

    def setup(self) -> None:
        from accelerate.utils import DistributedType, set_seed

        cfg = self.cfg
        if cfg.batch.trainer_cores is not None:
            pin_to_cores(cfg.batch.trainer_cores)
        self.accelerator = acc = make_accelerator(cfg.distributed.timeout_s)
        self.ds = acc.distributed_type == DistributedType.DEEPSPEED
        self.rank, self.world = acc.process_index, acc.num_processes
        set_seed(cfg.seed)
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
            print(f"# rlvr GRPO config (saved to {self.out / 'config.yaml'})\n{to_yaml(cfg)}")
        if acc.is_main_process:  # a bad environment or sampling setting fails before loading
            self.env = load_env(cfg, self.env)
        self._load_policy()
        self.opt = Optimization(
            acc, self.model, cfg.optim, cfg.max_steps, cfg.batch.micro_batch_size or 1
        )
        self.model = self.opt.model
        compute_dtype = self.policy.compute_dtype or resolve_dtype(cfg.model.dtype)
        cfg.batch = check_shared_layouts(
            token_logprobs, self.model, cfg.batch, self.pad_id, acc.device, compute_dtype
        )
        resume = resolve_resume(cfg.checkpoint.resume, cfg.output_dir)
        state = load_checkpoint(acc, resume, self.model, self.ds) if resume else {}
        self.in_flight = load_in_flight(resume) if resume and acc.is_main_process else []
        if any(len(b.groups) != cfg.examples_per_step for b in self.in_flight):
            log.warning("the checkpoint's in-flight batches have another batch size; regenerating")
            self.in_flight = []
        self.start_step = int(state.get("step", 0))
        self.data_position = int(state.get("data_position", 0))
        saved = state.get("curriculum")
        self.curriculum_state = None if saved is None else {int(k): v for k, v in saved.items()}
        self.logger = RunLogger(
            cfg,
            acc.is_main_process,
            self.start_step,
            state.get("wandb_run_id"),
            bar=("GRPO", cfg.max_steps) if cfg.logging.progress_bar else None,
        )
        if resume:
            self.logger.print(f"resumed from {resume} at step {self.start_step}")
        self._connect_servers()
        self.push_weights(self.start_step, initial=True)  # the server may hold other weights
        if acc.is_main_process:
            self.worker = start_worker(
                cfg,
                self.env,
                self.tokenizer,
                start_step=self.start_step,
                data_position=self.data_position,
                in_flight=self.in_flight,
                curriculum_state=self.curriculum_state,
                served_name=self.weights.served_name,
                pool=self.pool,
            )

    def _load_policy(self) -> None:
        cfg, acc = self.cfg, self.accelerator
        keep_reference = cfg.loss.beta > 0
        budget = self._budget()
        self.policy = policy = load_policy(
            cfg.model,
            cfg.lora,
            acc,
            keep_reference=keep_reference,
            sampled_len=cfg.batch.max_seq_len,
        )
        fit_policy(policy, cfg.model, cfg.lora, budget, acc, keep_reference=keep_reference)
        self.model, self.tokenizer, self.pad_id = policy.model, policy.tokenizer, policy.pad_id
        self.hooks = policy.hooks
        self.split_cost = split_cost(self.model)  # what a folded micro-batch's plan charges
        self.ref_model = None
        if cfg.loss.beta > 0 and not cfg.lora.enabled:
            if self.ds:
                raise ConfigError(
                    "loss.beta > 0 with full fine-tuning under DeepSpeed is not supported; "
                    "use LoRA (its reference is the base model, adapter disabled)"
                )
            self.ref_model = load_model(policy.path, cfg.model, policy.reasoning_vocab)
            self.ref_model.requires_grad_(False).eval().to(acc.device)

    def _budget(self) -> Budget:
        """The largest micro-batch this run can form, for the start-up memory check."""
        b = self.cfg.batch
        tokens = largest_micro_batch(b.micro_batch_size, b.micro_batch_tokens, b.max_seq_len)
        knob = "batch.micro_batch_tokens" if b.micro_batch_tokens else "batch.micro_batch_size"
        return Budget(tokens, knob, b.max_seq_len, "batch.max_seq_len")

    def _connect_servers(self) -> None:
        """How weights reach every server (see rlvr.weight_sync.connect); every rank joins."""
        self.connection = connect(
            self.cfg,
            self.accelerator,
            self.model,
            tokenizer=self.tokenizer,
            reasoning_vocab=self.policy.reasoning_vocab,
            compute_dtype=self.policy.compute_dtype,
            env=self.env,
            start_step=self.start_step,
            say=self.logger.print,
        )
        self.weights, self.pool = self.connection.weights, self.connection.pool
        self.probes = PushProbes(self.connection)

    # ---- the loop -------------------------------------------------------------------

    def run(self, stop_after: int | None = None) -> list[dict[str, float]]:
        """Train to max_steps (or `stop_after` steps); returns each step's metrics."""
        self.setup()
        cfg = self.cfg
        cadence = Cadence(
            total_steps=cfg.max_steps,
            eval_every=cfg.eval.every,
            save_every=cfg.checkpoint.every,
            eval_at_start=cfg.eval.at_start,
            eval_at_end=bool(cfg.eval.every),
        )
        try:
            return run_steps(self, cadence, self.start_step, stop_after)
        finally:
            self.close()

    def train_step(self, step: int) -> dict[str, float]:
        """One step: batch -> forward/backward -> optimizer -> push -> log; its metrics."""
        reset_peak(self.accelerator.device)
        laps = Laps()
        batch = laps.time("time/wait_rollouts", self._next_batch, step)
        trained = laps.time("time/forward_backward", self.forward_backward, batch)
        lr = self.opt.lr
        grad_norm = laps.time(
            "time/optimizer", self.opt.step, has_gradient(batch, self.cfg.loss.beta)
        )
        pushed = self.push_weights(step + 1)
        self.data_position = batch.data_position
        metrics = self._step_metrics(batch, trained, lr, grad_norm, pushed, laps)
        self._report(step + 1, metrics, batch.table)
        return metrics

    def _step_metrics(
        self,
        batch: TrainBatch,
        trained: Trained,
        lr: float,
        grad_norm: float,
        pushed: Pushed,
        laps: Laps,
    ) -> dict[str, float]:
        """Everything a step logs: the batch's rollout metrics, the loss statistics, the
        optimizer, the push and its probe, times, throughput and memory."""
        step_s = laps.elapsed()
        return {
            **batch.metrics,
            **trained.stats,
            "loss_tokens": batch.loss_tokens,
            "grad_norm": grad_norm,
            "lr": lr,
            **laps.seconds,
            "time/weight_push": pushed.seconds,
            **{f"push/{i}/seconds": v for i, v in self.weights.seconds.items()},
            **pushed.probe,
            "time/step": step_s,
            **distill_wait(batch.metrics, laps.seconds["time/wait_rollouts"], step_s),
            **trained.throughput(batch, laps.seconds["time/forward_backward"]),
            "throughput/tokens_per_s": batch.metrics["rollouts/completion_tokens"] / step_s,
            "memory/peak_gib": peak_bytes(self.accelerator.device) / GIB,
            **self.hooks.weight_metrics(self.accelerator.unwrap_model(self.model)),
        }

    def _next_batch(self, step: int) -> TrainBatch:
        """The main process takes the worker's batch and scores it; all ranks get it."""
        batch = None
        if self.accelerator.is_main_process:
            rollouts = self.worker.get(step, timeout_s=self._rank0_deadline_s)
            batch = build_train_batch(rollouts, self.cfg, self.hooks)
            batch.metrics["rollouts/retried_groups"] = rollouts.retried_groups
            batch.metrics["fleet/request_errors"] = rollouts.request_errors
            batch.metrics.update(rollouts.servers)
            if rollouts.curriculum_state is not None:
                self.curriculum_state = rollouts.curriculum_state
        if self.world > 1:
            from accelerate.utils import broadcast_object_list

            batch = broadcast_object_list([batch])[0]
        return batch

    @property
    def _rank0_deadline_s(self) -> float:
        """How long rank 0 waits for work the other ranks wait on in a collective: shorter
        than their timeout, so the error a user sees is rank 0's, which says what is slow."""
        return 0.9 * self.cfg.distributed.timeout_s

    def forward_backward(self, batch: TrainBatch) -> Trained:
        """Accumulate the gradients of this rank's shard of `batch`; return what the step
        measured over all ranks. A loss that is not finite raises `NonFiniteStepError` here,
        alike on every rank, before the optimizer moves anything."""
        cfg = self.cfg
        normaliser = step_normaliser(cfg.loss, batch, cfg.batch.max_seq_len)
        stats = StepStats()
        # nothing to train (alike on every rank: the batch is the whole step's)
        if not has_gradient(batch, cfg.loss.beta):
            return Trained(summarise({}), forwarded=batch.tokens, slots=batch.tokens)
        plan = plan_step(
            batch.samples,
            self.model,
            cfg.batch,
            self.rank,
            self.world,
            self.pad_id,
            self.split_cost,
        )
        mine, layout = plan.micro_batches, plan.layout
        self.model.train()
        for i, chunk in enumerate(mine):
            last = i == len(mine) - 1
            mb = layout.collate(chunk).to(self.accelerator.device)
            mask = self.hooks.logit_mask(mb)
            reference = functools.partial(self._reference_logprobs, mask_logits=mask)
            with self.opt.accumulating(last):
                loss, terms = micro_batch_loss(
                    self.model, mb, cfg, normaliser, self.world, reference, mask
                )
                self.opt.backward(loss, last)
            stats.add(terms)
            stats.count("slots", layout.slots(chunk))
            stats.count("forwarded", layout.forwarded(chunk))
        raw = stats.read()
        if self.world > 1:
            from accelerate.utils import gather_object

            raw = merge_ranks(gather_object([raw]))
        trained = Trained(summarise(raw), forwarded=raw["forwarded"], slots=raw["slots"])
        self.opt.check_loss(trained.stats["loss/total"])
        return trained

    @torch.no_grad()
    def _reference_logprobs(
        self, mb: MicroBatch, mask_logits: MaskLogits | None = None
    ) -> torch.Tensor:
        if self.ref_model is not None:
            model, context = self.ref_model, contextlib.nullcontext()
        else:  # LoRA: the initial policy, see `reference_mode`
            model, context = self.model, reference_mode(self.accelerator.unwrap_model(self.model))
        with context:
            temperature = self.cfg.sampling.temperature
            return sequence_scores(model, mb, temperature, mask_logits=mask_logits).logprobs

    def push_weights(self, version: int, initial: bool = False) -> Pushed:
        """Publish the current weights as weight `version`: push them to vf-vllm (all ranks;
        skipped after the initial push with `server.push_weights=false`) and probe them, inside
        the worker's `publishing`, which fixes every batch's policy version (`RolloutWorker`).
        A push no server holds after a second try stops the run, the trained step saved."""
        seconds, pushed = None, Pushed()
        try:
            with self._publishing(version):
                if initial or self.cfg.server.push_weights:
                    seconds = self.weights.push(version)
                    probed = self.probes.check(self.model, self.accelerator, version, initial)
                    pushed = Pushed(seconds, {**verified_metrics(self.weights.verified), **probed})
        except WeightsNotServedError:
            if seconds is None and not initial:  # the push's exact check: every rank is here
                self.save(version)
            raise
        return pushed

    def _publishing(self, version: int) -> contextlib.AbstractContextManager:
        """The worker's publishing of `version` (see `RolloutWorker.publishing`); nothing to
        wait for or release where no worker runs (other ranks; the initial push)."""
        if self.worker is None:
            return contextlib.nullcontext()
        return self.worker.publishing(version, self.weights.release, self._rank0_deadline_s)

    def _report(self, step: int, metrics: dict[str, float], table: list[dict[str, Any]]) -> None:
        logger = self.logger
        mismatch = mismatch_warning(step, metrics, self.cfg.logging.mismatch_kl_warn)
        if mismatch:
            logger.warn(mismatch)
        split = split_warning(step, metrics)
        if split and not self._warned_split:
            self._warned_split = True
            logger.warn(split)
        logger.log(step, metrics)
        if not self.cfg.logging.progress_bar:
            logger.print(step_line(step, self.cfg.max_steps, metrics))
        if table and (step % self.cfg.logging.table_every == 0 or step == 1):
            logger.log_samples(step, table)

    # ---- evaluation, checkpoints, final model -----------------------------------------

    def evaluate(self, step: int) -> dict[str, float] | None:
        if not self.accelerator.is_main_process:
            return None
        cfg = self.cfg.eval
        began = time.perf_counter()
        result = self.worker.evaluate(
            cfg.num_examples, cfg.rollouts_per_example, timeout_s=self._rank0_deadline_s
        )
        metrics = result.logged("eval")
        for name, each in result.per_env.items():
            metrics.update(each.logged(f"eval/{name}"))
        metrics["eval/time"] = time.perf_counter() - began
        self.logger.log(step, metrics)
        passes = "".join(f", pass@{k} {v:.3f}" for k, v in result.pass_at_k.items() if k > 1)
        envs = "".join(f", {name} {each.reward:.4f}" for name, each in result.per_env.items())
        self.logger.print(f"eval at step {step}: reward {result.reward:.4f}{passes}{envs}")
        return metrics

    def save(self, step: int) -> Path:
        """A checkpoint after `step` steps (the weights are version `step`), with the rollout
        batches in flight and the curriculum as the last of them left it."""
        in_flight = []
        if self.worker is not None and self.cfg.batch.async_level:
            in_flight = self.worker.in_flight(step, timeout_s=self._rank0_deadline_s)
        curriculum = in_flight[-1].curriculum_state if in_flight else self.curriculum_state
        state = {
            "step": step,
            "data_position": self.data_position,
            "weight_version": step,
            "wandb_run_id": self.logger.run_id if self.logger else None,
        }
        if curriculum is not None:
            state["curriculum"] = {str(k): v for k, v in curriculum.items()}
        path = save_checkpoint(
            self.accelerator, self.cfg.output_dir, state, self.cfg.checkpoint.keep_last, in_flight
        )
        self.logger.print(f"checkpoint saved: {path}")
        return path

    def save_final(self) -> Path:
        final = save_final(
            self.accelerator,
            self.model,
            self.tokenizer,
            self.out,
            self.cfg.lora.enabled,
            self.policy.reasoning_vocab,
        )
        self.logger.print(f"final {'adapter' if self.cfg.lora.enabled else 'model'}: {final}")
        return final

    def close(self) -> None:
        close_rollouts(self.worker, self.env)
        if self.weights is not None:
            self.weights.close()
        if self.logger is not None:
            self.logger.close()
