"""The GRPO training loop: accelerate (single process, DDP or DeepSpeed ZeRO-3), rollouts from
vf-vllm, a weight push after every optimizer step, checkpoints, evaluation and logging.

One step (`Trainer.train_step`):
  1. take the step's `TrainBatch` (`rlvr.batch`): the rollout worker generated it ahead by at
     most async_level steps; the main process scores the samples with group advantages
     (`rlvr.trainer.train_batch`) and broadcasts them;
  2. each rank trains on its shard in micro-batches; the loss is normalised by the step's
     global loss-token count, and every rank runs the same number of micro-batches;
  3. one optimizer step (clipped), one scheduler step;
  4. publish the new weights as version step+1: push them into every vf-vllm
     (`rlvr.weight_sync.fleet.FleetPush`), probe that each serves them
     (`rlvr.weight_sync.probe`; a server that does not is taken out of rotation), and move
     the rollout worker's version clock;
  5. log; the run loop (`rlvr.trainer.cadence.run_steps`) evaluates and checkpoints.

The module is the loop a reader follows top to bottom, set-up to close; the parts it is built
from live beside it in rlvr.trainer and rlvr.weight_sync.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr.batch import MicroBatch, TrainBatch
from rlvr.config import Config, ConfigError, save_config, to_yaml
from rlvr.config.sampling import SamplingFilterError
from rlvr.model.policy import load_model, load_policy, reference_mode, resolve_dtype, save_final
from rlvr.model.rope import check_served_rope
from rlvr.rollouts.client import make_client
from rlvr.rollouts.groups import UnsupportedEnvironmentError, check_rollout_stage_only
from rlvr.rollouts.mixture import leaves, load_mixture, routed_filter
from rlvr.rollouts.prompts import prompt_length_filter
from rlvr.rollouts.request_args import build_sampling_args
from rlvr.rollouts.worker import RolloutWorker
from rlvr.trainer.cadence import Cadence, run_steps
from rlvr.trainer.checkpoint import load_checkpoint, load_in_flight, resolve_resume, save_checkpoint
from rlvr.trainer.cores import pin_to_cores
from rlvr.trainer.layout_check import check_shared_layouts
from rlvr.trainer.logprobs import MaskLogits, sequence_scores
from rlvr.trainer.loss import (
    LossTerms,
    StepStats,
    merge_ranks,
    normalised_loss,
    policy_loss,
    step_normaliser,
    summarise,
)
from rlvr.trainer.memory import GIB, Budget, fit_policy, peak_bytes, reset_peak, split_cost
from rlvr.trainer.metrics import Laps, RunLogger, step_line
from rlvr.trainer.micro_batches import largest_micro_batch
from rlvr.trainer.optimizer import Optimization, make_accelerator
from rlvr.trainer.prefix_tree import plan_micro_batches, tree_attention
from rlvr.trainer.train_batch import build_train_batch
from rlvr.weight_sync.connect import connect
from rlvr.weight_sync.control import ServerError
from rlvr.weight_sync.probe import WeightsNotServedError, served_logprobs, trainer_logprobs

log = logging.getLogger(__name__)


def micro_batch_loss(
    model: torch.nn.Module,
    mb: MicroBatch,
    cfg: Config,
    normaliser: float,
    world_size: int,
    reference: Any = None,
    mask_logits: MaskLogits | None = None,
) -> tuple[torch.Tensor, LossTerms]:
    """Forward one micro-batch; return its normalised loss (ready for backward) and its terms,
    with every statistic of `rlvr.trainer.loss.STATS`.

    `normaliser` is the step's `rlvr.trainer.loss.step_normaliser`; `reference(mb)` returns the
    reference model's token log-probabilities (needed when loss.beta > 0); `mask_logits`
    forbids tokens per position (see `rlvr.trainer.logprobs`)."""
    scores = sequence_scores(
        model, mb, cfg.sampling.temperature, with_entropy=True, mask_logits=mask_logits
    )
    ref = reference(mb) if cfg.loss.beta > 0 else None
    terms = policy_loss(
        scores.logprobs,
        mb.sampler_logprobs,
        mb.advantages,
        mb.loss_mask,
        cfg.loss,
        ref,
        mb.sequence_ids,
        mb.rollout_tokens,
    )
    terms.stats["entropy"] = scores.entropy_sum
    return normalised_loss(terms.loss_sum, normaliser, world_size), terms


def has_gradient(batch: TrainBatch, beta: float) -> bool:
    """Whether a step's loss can move the weights: some loss token with a non-zero advantage,
    or the KL penalty (`beta` > 0), which pulls toward the reference whatever the advantages.

    A step without either (every group dropped, or every group's rewards equal) skips forward,
    backward and the optimizer: AdamW would otherwise move the weights on its momentum alone,
    repeating the last step that had signal at two thirds or more of its size."""
    return batch.loss_tokens > 0 and (batch.has_signal or beta > 0)


@dataclass
class Trained:
    """What one step's forward/backward measured, over all ranks."""

    stats: dict[str, float]
    """The statistics of `rlvr.trainer.loss.STATS` the step measured, by their logged names
    (see `rlvr.trainer.loss.summarise`)."""
    forwarded: float
    """Token positions the forward passes computed (a shared prefix counts once)."""
    slots: float
    """Token positions the micro-batches' tensors held, padding included."""

    def throughput(self, batch: TrainBatch, forward_backward_s: float) -> dict[str, float]:
        """Training speed, and the shares of the work padding cost and prefix sharing saved."""
        return {
            "throughput/train_tokens_per_s": batch.tokens / max(forward_backward_s, 1e-9),
            "throughput/padded_frac": 1 - self.forwarded / max(self.slots, 1),
            "throughput/prefix_saved_frac": 1 - self.forwarded / max(batch.tokens, 1),
        }


@dataclass
class Pushed:
    """A step's weight push: the seconds it took and what it measured per server
    (`push/<i>/seconds`, `push/<i>/probe_*`; `push/probe_*` is the server with the largest
    probe_kl); empty when the step did not push or nothing was probed."""

    seconds: float = 0.0
    probe: dict[str, float] = field(default_factory=dict)


def probe_metrics(checked: dict[int, dict[str, float]]) -> dict[str, float]:
    """Each server's probe metrics under `push/<i>/`, and those of the server with the
    largest `push/probe_kl` unprefixed (the worst, for one curve whatever the count)."""
    out = {
        key.replace("push/", f"push/{i}/", 1): value
        for i, metrics in checked.items()
        for key, value in metrics.items()
    }
    if checked:
        worst = max(checked.values(), key=lambda m: m.get("push/probe_kl", 0.0))
        out.update(worst)
    return out


class Trainer:
    """Build with a config (and optionally an environment object instead of `env.id`), then
    `run()`. `run(stop_after=k)` stops after k steps with a checkpoint, as an interrupted run
    would (used by the resume test)."""

    def __init__(self, config: Config, env: Any = None):
        config.validate()
        self.cfg = config
        self.env = env
        self.history: list[dict[str, float]] = []
        self.worker: RolloutWorker | None = None
        self.weights = None
        """How weights reach the server (`rlvr.weight_sync.base.WeightPush`), once connected."""
        self.pushes = 0
        """Weight pushes this rank took part in (every rank joins every push)."""
        self.logger: RunLogger | None = None
        self._warned_split = False
        """Whether a step's split sequence-level ratio (`ratio/split_rollout_frac`) was told."""

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
        self.out = Path(cfg.output_dir)
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.out / "config.yaml")
            print(f"# rlvr GRPO config (saved to {self.out / 'config.yaml'})\n{to_yaml(cfg)}")
        if acc.is_main_process:  # a bad environment or sampling setting fails before loading
            self._load_env()
        self._load_policy()
        self.opt = Optimization(
            acc, self.model, cfg.optim, cfg.max_steps, cfg.batch.micro_batch_size or 1
        )
        self.model = self.opt.model
        compute_dtype = self.policy.compute_dtype or resolve_dtype(cfg.model.dtype)
        cfg.batch = check_shared_layouts(
            self.model, cfg.batch, self.pad_id, acc.device, compute_dtype
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
        """The curriculum's estimates after the last batch trained (None: no curriculum)."""
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
        self._restore_probes(state.get("push_probes") or {})
        unwrapped = acc.unwrap_model(self.model)
        for push, url in zip(self.weights.pushes, cfg.server.urls, strict=True):
            check_served_rope(unwrapped.config, cfg.model.name, push.control, url)
        self.push_weights(self.start_step, initial=True)  # the server may hold other weights
        if acc.is_main_process:
            self._start_worker()

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
        self.probes = self.connection.probes

    def _restore_probes(self, saved: dict[str, dict]) -> None:
        """Each server's probe as the checkpoint left it (by URL), so that a resume's first
        push is judged like any later one; a server the checkpoint does not know calibrates
        afresh."""
        for url, probe in zip(self.cfg.server.urls, self.probes, strict=False):
            if url in saved:
                probe.load_state(saved[url])

    def _load_env(self) -> None:
        """The environment (rank 0 only), with its sampling defaults checked against what the
        trainer can reproduce."""
        import verifiers as vf

        cfg = self.cfg
        if self.env is None and cfg.envs:
            self.env = load_mixture(cfg.envs)
        elif self.env is None:
            self.env = vf.load_environment(cfg.env.id, **cfg.env.args)
        for name, env in leaves(self.env).items():
            try:
                build_sampling_args(cfg.sampling, env.sampling_args)
                check_rollout_stage_only(env)
            except (SamplingFilterError, UnsupportedEnvironmentError) as e:
                raise ConfigError(f"environment {name or cfg.env_label}: {e}") from None

    def _start_worker(self) -> None:
        cfg = self.cfg
        self.env.set_max_seq_len(cfg.batch.max_seq_len)
        fits = routed_filter(
            self.env,
            lambda env: prompt_length_filter(
                self.tokenizer, cfg.batch.max_prompt_len, getattr(env, "tool_defs", None)
            ),
        )

        def client(url: str) -> Any:
            return make_client(
                url,
                cfg.server.api_key,
                cfg.server.timeout_s,
                max_connections=max(cfg.batch.batch_size * 2, 64),
                temperature=cfg.sampling.temperature,
                rollouts=cfg.rollouts,
            )

        self.worker = RolloutWorker(
            self.env,
            self.env.get_dataset(),
            cfg,
            client_factory=client,
            start_step=self.start_step,
            version=self.start_step,
            data_position=self.data_position,
            prompt_fits=fits,
            preloaded=self.in_flight,
            curriculum_state=self.curriculum_state,
            served_name=self.weights.served_name,
            pool=self.pool,
        ).start()

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
        attention = None
        if cfg.batch.prefix_sharing:
            attention = tree_attention(self.model, cfg.batch.max_seq_len)
        plan = plan_micro_batches(
            batch.samples, self.rank, self.world, cfg.batch, self.pad_id, attention, self.split_cost
        )
        mine = plan.micro_batches
        self.model.train()
        for i, chunk in enumerate(mine):
            last = i == len(mine) - 1
            mb = plan.collate(chunk).to(self.accelerator.device)
            mask = self.hooks.logit_mask(mb)
            reference = functools.partial(self._reference_logprobs, mask_logits=mask)
            with self.opt.accumulating(last):
                loss, terms = micro_batch_loss(
                    self.model, mb, cfg, normaliser, self.world, reference, mask
                )
                self.opt.backward(loss, last)
            stats.add(terms)
            stats.count("slots", plan.slots(chunk))
            stats.count("forwarded", plan.forwarded(chunk))
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
        """Publish the current weights as weight `version`: push them to vf-vllm (all ranks
        take part; skipped after the initial push with `server.push_weights=false`) and probe
        that the server serves them, inside the worker's `publishing`, which fixes every
        batch's policy version (see `RolloutWorker`), also across resumes."""
        pushed = Pushed()
        with self._publishing(version):
            if initial or self.cfg.server.push_weights:
                seconds = self.weights.push(version)
                self.pushes += 1
                pushed = Pushed(seconds, self._probe_push(version))
        return pushed

    def _publishing(self, version: int) -> contextlib.AbstractContextManager:
        """The worker's publishing of `version` (see `RolloutWorker.publishing`); nothing to
        wait for or release where no worker runs (other ranks; the initial push)."""
        if self.worker is None:
            return contextlib.nullcontext()
        return self.worker.publishing(version, self.weights.release, self._rank0_deadline_s)

    def _probe_push(self, version: int) -> dict[str, float]:
        """The probe of the push of `version` on every server that took it (see
        rlvr.weight_sync.probe): every rank runs the forward, the main process asks each
        server (twice at a server's first push, for its noise), and every rank checks the
        main process's scores, so all ranks agree. A server that fails is taken out of
        rotation (with one server, its error stops the run); a returning server that passes
        is admitted."""
        if not self.probes:
            return {}
        for i in self.weights.returned:  # connected afresh: calibrated afresh
            self.probes[i] = self.connection.new_probe()
        ids = self.probes[0].ids
        mine = trainer_logprobs(self.model, ids, self.accelerator.device)
        scores = None
        if self.accelerator.is_main_process:
            scores = mine, {i: self._served_scores(i, version) for i in self.weights.pushed}
        trainer, served = self.weights.agree(scores)
        checked: dict[int, dict[str, float]] = {}
        for i, answer in served.items():
            try:
                if isinstance(answer, str):
                    raise WeightsNotServedError(answer)
                scored, name, again = answer
                checked[i] = self.probes[i].check(trainer, scored, version, name, repeat=again)
            except WeightsNotServedError as e:
                if len(self.pool) == 1:
                    raise
                self.weights.take_out(i, f"failed the probe of weight version {version}: {e}")
            else:
                if i in self.weights.returned:
                    self.weights.admit(i, version)
        return probe_metrics(checked)

    def _served_scores(self, index: int, version: int) -> tuple | str:
        """Server `index`'s probe scores of `version` (a second scoring at its first push) and
        the name it served them under; or why it could not say."""
        push, probe = self.weights.pushes[index], self.probes[index]
        name = push.served_name(version)
        try:
            served = served_logprobs(push.control, name, probe.ids)
            again = None if probe.calibrated else served_logprobs(push.control, name, probe.ids)
        except ServerError as e:
            return f"could not score the probe: {e}"
        return served, name, again

    def _report(self, step: int, metrics: dict[str, float], table: list[dict[str, Any]]) -> None:
        logger = self.logger
        kl, lag = metrics.get("mismatch_kl", 0.0), metrics["rollouts/policy_lag"]
        if kl > self.cfg.logging.mismatch_kl_warn and lag == 0:
            # Only a batch sampled by the weights it trains measures what the sampler and the
            # trainer disagree on; with lag it also measures how far the policy moved since,
            # and the push probe (push/probe_kl) checks the pushes instead.
            logger.warn(
                f"step {step}: mismatch-KL {kl:.3g} between vf-vllm's sampling logprobs and "
                f"the trainer's exceeds {self.cfg.logging.mismatch_kl_warn:g} on a batch "
                "sampled by the weights it trains: the server samples differently from what "
                "the trainer computes (sampling settings, precision) or weights did not arrive"
            )
        split = metrics.get("ratio/split_rollout_frac", 0.0)
        if split > 0 and not self._warned_split:
            self._warned_split = True
            logger.warn(
                f"step {step}: {split:.1%} of the loss tokens belong to rollouts whose samples "
                "landed in different micro-batches or ranks, where each part takes its own "
                "sequence-level (GSPO or MIS) ratio (docs/training.md#loss-choices): "
                "set rollouts.token_in=true or raise batch.micro_batch_tokens"
            )
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
        urls = self.cfg.server.urls
        state["push_probes"] = {url: p.state() for url, p in zip(urls, self.probes, strict=False)}
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
        if self.worker is not None:
            self.worker.close()
        if self.weights is not None:
            self.weights.close()
        if self.logger is not None:
            self.logger.close()
