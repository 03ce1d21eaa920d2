"""The GRPO training loop: accelerate (single process, DDP or DeepSpeed ZeRO-3), rollouts from
vf-vllm, a weight push after every optimizer step, checkpoints, evaluation and logging.

One step:
  1. take the step's batch from the rollout worker (generated ahead by at most async_level
     steps), compute group advantages, turn rollouts into samples (main process), broadcast;
  2. each rank trains on its shard in micro-batches; the loss is normalised by the step's
     global loss-token count, and every rank runs the same number of micro-batches;
  3. one optimizer step (clipped), one scheduler step;
  4. push the new weights into vf-vllm, check with a probe that the server serves them
     (`rlvr.weight_sync.probe`), tell the worker the server now holds version step+1, and let the
     adapter sync unload versions no rollout still requests;
  5. log, evaluate and checkpoint on their cadences.

The module is longer than the others (~540 lines) on purpose: it is the loop a reader follows
top to bottom, set-up to close; the parts it is built from live beside it in rlvr.trainer and
rlvr.weight_sync (how weights reach the server: rlvr.weight_sync.connect).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.config import Config, ConfigError, save_config, to_yaml
from rlvr.model.policy import load_model, load_policy, reference_mode, resolve_dtype, save_final
from rlvr.model.rope import check_served_rope
from rlvr.reasoning_vocab.gate import ThinkGate
from rlvr.reasoning_vocab.mapping import row_cosines
from rlvr.rollouts.client import make_client
from rlvr.rollouts.groups import GroupResult, StepBatch
from rlvr.rollouts.prompts import prompt_length_filter
from rlvr.rollouts.request_args import SamplingFilterError, build_sampling_args
from rlvr.rollouts.worker import RolloutWorker
from rlvr.trainer.advantages import group_advantages
from rlvr.trainer.cadence import Cadence
from rlvr.trainer.checkpoint import load_checkpoint, load_in_flight, resolve_resume, save_checkpoint
from rlvr.trainer.cores import pin_to_cores
from rlvr.trainer.layout_check import check_shared_layouts
from rlvr.trainer.logprobs import MaskLogits, sequence_scores
from rlvr.trainer.loss import StatsAccumulator, normalised_loss, policy_loss
from rlvr.trainer.memory import GIB, Budget, peak_bytes, reset_peak
from rlvr.trainer.metrics import RunLogger, distribution, mean, metric_means, step_line
from rlvr.trainer.micro_batches import MicroBatch, Sample, largest_micro_batch
from rlvr.trainer.optimizer import Optimization, make_accelerator
from rlvr.trainer.prefix_tree import plan_micro_batches, tree_attention
from rlvr.weight_sync.connect import connect
from rlvr.weight_sync.probe import served_logprobs, trainer_logprobs

log = logging.getLogger(__name__)


def micro_batch_loss(
    model: torch.nn.Module,
    mb: MicroBatch,
    cfg: Config,
    global_tokens: float,
    world_size: int,
    reference: Any = None,
    mask_logits: MaskLogits | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward one micro-batch; return its normalised loss (ready for backward) and stats.

    `reference(mb)` returns the reference model's token log-probabilities (needed when
    loss.beta > 0); `mask_logits` forbids tokens per position (see `rlvr.trainer.logprobs`)."""
    scores = sequence_scores(
        model, mb, cfg.sampling.temperature, with_entropy=True, mask_logits=mask_logits
    )
    ref = reference(mb) if cfg.loss.beta > 0 else None
    terms = policy_loss(
        scores.logprobs, mb.sampler_logprobs, mb.advantages, mb.loss_mask, cfg.loss, ref
    )
    terms.stats["entropy_sum"] = scores.entropy_sum
    terms.stats["loss_sum"] = terms.loss_sum.detach()
    return normalised_loss(terms.loss_sum, global_tokens, world_size), terms.stats


def build_samples(
    batch: StepBatch, cfg: Config, gate: ThinkGate | None = None
) -> tuple[list[Sample], dict[str, float], list]:
    """Advantages per group -> samples; the batch's rollout metrics (with a reasoning
    vocabulary's `gate`, its use in the sampled tokens); sample-table rows."""
    limit = cfg.batch.max_errored_frac

    def too_errored(group: GroupResult) -> bool:
        return group.errored > limit * (len(group.rollouts) + group.errored)

    groups = [g for g in batch.groups if g.rollouts and not too_errored(g)]
    advantages, flat = group_advantages(
        [[r.reward for r in g.rollouts] for g in groups], cfg.loss.scale_rewards
    )
    samples: list[Sample] = []
    scored: list[tuple[Any, float]] = []
    dropped = 0
    for group, group_adv, is_flat in zip(groups, advantages, flat, strict=True):
        if is_flat and cfg.loss.drop_zero_variance:
            dropped += 1
            continue
        for rollout, adv in zip(group.rollouts, group_adv, strict=True):
            scored.append((rollout, adv))
            for sample in rollout.samples:
                sample.advantage = adv
                samples.append(sample)
    rollouts = batch.rollouts
    gen_tokens = batch.completion_tokens
    metrics: dict[str, float] = {
        **distribution("reward", [r.reward for r in rollouts]),
        **dict(sorted(metric_means([r.metrics for r in rollouts], "env").items())),
        "rollouts/count": len(rollouts),
        "rollouts/errored": batch.errored,
        "rollouts/truncated": sum(r.truncated for r in rollouts),
        "rollouts/zero_variance_groups": sum(flat),
        "rollouts/dropped_groups": dropped,
        "rollouts/dropped_errored_groups": sum(map(too_errored, batch.groups)),
        "rollouts/skipped_long_prompts": batch.skipped_prompts,
        "rollouts/samples": len(samples),
        "rollouts/completion_tokens": gen_tokens,
        "rollouts/completion_len": gen_tokens / max(len(rollouts), 1),
        "rollouts/turns": mean([r.num_turns for r in rollouts]),
        "rollouts/policy_lag": batch.step - batch.min_policy_version,
        "rollouts/policy_lag_min": batch.step - batch.newest_policy_version,
        "time/generate": batch.generate_s,
        "throughput/gen_tokens_per_s": gen_tokens / max(batch.generate_s, 1e-9),
    }
    if gate is not None:
        metrics.update(gate.rollout_metrics(s for r in rollouts for s in r.samples))
    rows = [
        {
            "example_id": r.example_id,
            "prompt": r.prompt_text,
            "completion": r.completion_text,
            "answer": r.answer,
            "reward": r.reward,
            "advantage": adv,
        }
        for r, adv in scored[: cfg.logging.samples_per_step]
    ]
    return samples, metrics, rows


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
        self.sync = None
        self.pushes = 0
        """Weight pushes this rank took part in (every rank joins every push)."""
        self.probe_metrics: dict[str, float] = {}
        """What the probe of the last push measured (`push/probe_*`; empty: not probed)."""
        self.logger: RunLogger | None = None

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
        compute_dtype = self.compute_dtype or resolve_dtype(cfg.model.dtype)
        cfg.batch = check_shared_layouts(self.model, cfg.batch, self.pad_id, acc.device,
                                         compute_dtype)  # fmt: skip
        resume = resolve_resume(cfg.checkpoint.resume, cfg.output_dir)
        state = load_checkpoint(acc, resume, self.model, self.ds) if resume else {}
        self.in_flight = load_in_flight(resume) if resume and acc.is_main_process else []
        if any(len(b.groups) != cfg.examples_per_step for b in self.in_flight):
            log.warning("the checkpoint's in-flight batches have another batch size; regenerating")
            self.in_flight = []
        self.start_step = int(state.get("step", 0))
        self.data_position = int(state.get("data_position", 0))
        self.version = self.start_step
        self.logger = RunLogger(
            cfg,
            acc.is_main_process,
            self.start_step,
            state.get("wandb_run_id"),
            bar=("GRPO", cfg.max_steps) if cfg.logging.progress_bar else None,
        )
        if resume:
            self.logger.print(f"resumed from {resume} at step {self.start_step}")
        self._connect_server()
        unwrapped = acc.unwrap_model(self.model)
        check_served_rope(unwrapped.config, cfg.model.name, self.sync.control, cfg.server.base_url)
        self.push_weights(self.start_step, initial=True)  # the server may hold other weights
        if acc.is_main_process:
            self._start_worker()

    def _load_policy(self) -> None:
        cfg, acc = self.cfg, self.accelerator
        policy = load_policy(
            cfg.model,
            cfg.lora,
            acc,
            keep_reference=cfg.loss.beta > 0,
            budget=self._budget(),
            sampled_len=cfg.batch.max_seq_len,
        )
        self.model, self.tokenizer, self.pad_id = policy.model, policy.tokenizer, policy.pad_id
        self.reasoning_vocab = policy.reasoning_vocab
        self.compute_dtype = policy.compute_dtype
        self.gate = None
        if policy.reasoning_vocab is not None:
            self.gate = ThinkGate.from_tokenizer(policy.reasoning_vocab, policy.tokenizer)
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
        return Budget(tokens, knob, b.max_seq_len, "batch.max_seq_len", b.prefix_sharing)

    def _connect_server(self) -> None:
        """How weights reach the server (see rlvr.weight_sync.connect); every rank joins."""
        connection = connect(
            self.cfg,
            self.accelerator,
            self.model,
            tokenizer=self.tokenizer,
            reasoning_vocab=self.reasoning_vocab,
            compute_dtype=self.compute_dtype,
            env=self.env,
            start_step=self.start_step,
            say=self.logger.print,
        )
        self.sync, self.probe = connection.sync, connection.probe

    def rollout_model(self, version: int) -> str:
        """The model name that serves weight `version` to rollouts: that version's adapter
        under adapter sync; the served base model under merged pushes."""
        from rlvr.weight_sync.adapter import AdapterSync

        if isinstance(self.sync, AdapterSync):
            return self.sync.served_name(version)
        return self.cfg.served_model

    def _load_env(self) -> None:
        """The environment (rank 0 only), with its sampling defaults checked against what the
        trainer can reproduce."""
        import verifiers as vf

        cfg = self.cfg
        if self.env is None:
            self.env = vf.load_environment(cfg.env.id, **cfg.env.args)
        try:
            build_sampling_args(cfg.sampling, self.env.sampling_args)
        except SamplingFilterError as e:
            raise ConfigError(f"environment {cfg.env.id}: {e}") from None

    def _start_worker(self) -> None:
        cfg = self.cfg
        self.env.set_max_seq_len(cfg.batch.max_seq_len)
        fits = prompt_length_filter(
            self.tokenizer, cfg.batch.max_prompt_len, getattr(self.env, "tool_defs", None)
        )
        self.worker = RolloutWorker(
            self.env,
            self.env.get_dataset(),
            cfg,
            client_factory=lambda: make_client(
                cfg.server.base_url,
                cfg.server.api_key,
                cfg.server.timeout_s,
                max_connections=max(cfg.batch.batch_size * 2, 64),
                temperature=cfg.sampling.temperature,
            ),  # fmt: skip
            start_step=self.start_step,
            version=self.version,
            data_position=self.data_position,
            prompt_fits=fits,
            preloaded=self.in_flight,
            model=self.rollout_model,
        ).start()

    # ---- the loop -------------------------------------------------------------------

    def run(self, stop_after: int | None = None) -> list[dict[str, float]]:
        """Train to max_steps (or `stop_after` steps); returns each step's metrics."""
        self.setup()
        cfg, total = self.cfg, self.cfg.max_steps
        cadence = Cadence(
            total_steps=total,
            eval_every=cfg.eval.every,
            save_every=cfg.checkpoint.every,
            eval_at_start=cfg.eval.at_start,
            eval_at_end=bool(cfg.eval.every),
        )
        try:
            if cadence.evaluate_first(self.start_step):
                self.evaluate(0)
            for step in range(self.start_step, total):
                self.history.append(self.train_step(step))
                done = step + 1
                if cadence.stop_here(done, stop_after):
                    self.save(done)  # an interrupted run resumes from here
                    return self.history
                if cadence.evaluate_after(done):
                    self.evaluate(done)
                if cadence.save_after(done):
                    self.save(done)
            if cadence.eval_at_end:
                self.evaluate(total)
            if not cadence.save_after(total):
                self.save(total)
            self.save_final()
            return self.history
        finally:
            self.close()

    def _next_batch(self, step: int) -> tuple[list[Sample], dict[str, float], list, int]:
        """The main process takes the worker's batch and builds samples; all ranks get them."""
        payload = None
        if self.accelerator.is_main_process:
            batch = self.worker.get(step, timeout_s=self._rank0_deadline_s)
            payload = (*build_samples(batch, self.cfg, self.gate), batch.data_position)
        if self.world > 1:
            from accelerate.utils import broadcast_object_list

            payload = broadcast_object_list([payload])[0]
        return payload

    @property
    def _rank0_deadline_s(self) -> float:
        """How long rank 0 waits for work the other ranks wait on in a collective: shorter
        than their timeout, so the error a user sees is rank 0's, which says what is slow."""
        return 0.9 * self.cfg.distributed.timeout_s

    def train_step(self, step: int) -> dict[str, float]:
        device = self.accelerator.device
        reset_peak(device)
        began = time.perf_counter()
        samples, metrics, rows, data_position = self._next_batch(step)
        waited = time.perf_counter() - began
        global_tokens = sum(s.num_loss_tokens for s in samples)
        t0 = time.perf_counter()
        stats = self.forward_backward(samples, global_tokens)
        self.opt.check_loss(stats.get("loss", 0.0))  # alike on every rank: stats are global
        t1 = time.perf_counter()
        lr = self.opt.lr
        grad_norm = self.opt.step(global_tokens > 0)
        t2 = time.perf_counter()
        push_s = self.push_weights(step + 1)
        t3 = time.perf_counter()
        self.data_position = data_position
        step_s = t3 - began
        train_tokens = sum(len(s) for s in samples)
        forwarded = stats.get("forwarded", train_tokens)
        metrics.update(
            {
                "loss/total": stats.get("loss", 0.0),
                "loss/pg": stats.get("pg_loss", 0.0),
                "loss/kl_ref": stats.get("kl_ref", 0.0),
                "entropy": stats.get("entropy", 0.0),
                "ratio/mean": stats.get("ratio", 1.0),
                "ratio/min": stats.get("ratio_min", 1.0),
                "ratio/max": stats.get("ratio_max", 1.0),
                "ratio/masked_frac": stats.get("ratio_masked", 0.0),
                "ratio/clipped_frac": stats.get("clipped", 0.0),
                "mismatch_kl": stats.get("mismatch_kl", 0.0),
                "loss_tokens": global_tokens,
                "grad_norm": grad_norm,
                "lr": lr,
                "time/wait_rollouts": waited,
                "time/forward_backward": t1 - t0,
                "time/optimizer": t2 - t1,
                "time/weight_push": push_s,
                **self.probe_metrics,
                "time/step": step_s,
                "throughput/train_tokens_per_s": train_tokens / max(t1 - t0, 1e-9),
                "throughput/padded_frac": 1 - forwarded / max(stats.get("slots", forwarded), 1),
                "throughput/prefix_saved_frac": 1 - forwarded / max(train_tokens, 1),
                "throughput/tokens_per_s": metrics["rollouts/completion_tokens"] / step_s,
                "memory/peak_gib": peak_bytes(device) / GIB,
            }
        )
        if self.reasoning_vocab is not None:  # every rank: ZeRO-3 gathers the rows
            unwrapped = self.accelerator.unwrap_model(self.model)
            metrics.update(row_cosines(unwrapped, self.reasoning_vocab))
        self._report(step + 1, metrics, rows)
        return metrics

    def forward_backward(self, samples: list[Sample], global_tokens: int) -> dict[str, float]:
        """Accumulate gradients of this rank's shard; return stats reduced over all ranks."""
        cfg = self.cfg
        acc = StatsAccumulator()
        if global_tokens == 0:  # every group dropped (alike on every rank: the count is global)
            return acc.summary()
        prefix_sharing = cfg.batch.prefix_sharing
        attention = tree_attention(self.model, cfg.batch.max_seq_len) if prefix_sharing else None
        plan = plan_micro_batches(samples, self.rank, self.world, cfg.batch, self.pad_id, attention)
        mine = plan.micro_batches
        self.model.train()
        for i, chunk in enumerate(mine):
            last = i == len(mine) - 1
            mb = plan.collate(chunk).to(self.accelerator.device)
            mask = self.gate.logit_mask(mb) if self.gate else None
            reference = functools.partial(self._reference_logprobs, mask_logits=mask)
            with self.opt.accumulating(last):
                loss, stats = micro_batch_loss(
                    self.model, mb, cfg, global_tokens, self.world, reference, mask
                )
                self.opt.backward(loss, last)
            acc.add({**stats, "slots": plan.slots(chunk), "forwarded": plan.forwarded(chunk)})
        if self.world > 1:
            from accelerate.utils import gather_object

            merged = StatsAccumulator()
            for values in gather_object([acc.values]):
                merged.add(values)
            acc = merged
        return acc.summary()

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

    def push_weights(self, version: int, initial: bool = False) -> float:
        """Send the current weights to vf-vllm as weight `version` (all ranks take part),
        probe that the server serves them, and record the version; returns the push's
        seconds. Not before the last batch the previous version generates has started (see
        `RolloutWorker`): every batch's policy version is then fixed, also across resumes."""
        if self.worker is not None and not initial:
            self.worker.wait_for_batches_of(version - 1, timeout_s=self._rank0_deadline_s)
        seconds, self.probe_metrics = 0.0, {}  # logged only for a step that pushed
        if initial or self.cfg.server.push_weights:
            seconds = self.sync.push(version)
            self.pushes += 1
            self.probe_metrics = self._probe_push(version)
        self.version = version
        if self.worker is not None:
            self.worker.set_version(version)
            self.sync.release(self.worker.versions_in_use())
        return seconds

    def _probe_push(self, version: int) -> dict[str, float]:
        """The probe of the push of `version` (see rlvr.weight_sync.probe): every rank runs the
        forward, the main process asks the server (twice at the initial push, for its noise),
        and every rank checks the main process's scores, so all raise together."""
        if self.probe is None:
            return {}
        ids = self.probe.ids
        mine = trainer_logprobs(self.model, ids, self.accelerator.device)
        scores = None
        if self.accelerator.is_main_process:
            name = self.rollout_model(version)
            served = served_logprobs(self.sync.control, name, ids)
            again = None if self.probe.calibrated else served_logprobs(self.sync.control, name, ids)
            scores = mine, served, again, name
        if self.world > 1:
            from accelerate.utils import broadcast_object_list

            scores = broadcast_object_list([scores])[0]
        trainer, served, again, name = scores
        return self.probe.check(trainer, served, version, name, repeat=again)

    def _report(self, step: int, metrics: dict[str, float], rows: list) -> None:
        logger = self.logger
        kl, lag = metrics["mismatch_kl"], metrics["rollouts/policy_lag"]
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
        logger.log(step, metrics)
        if not self.cfg.logging.progress_bar:
            logger.print(step_line(step, self.cfg.max_steps, metrics))
        if rows and (step % self.cfg.logging.table_every == 0 or step == 1):
            logger.log_samples(step, rows)

    # ---- evaluation, checkpoints, final model -----------------------------------------

    def evaluate(self, step: int) -> dict[str, float] | None:
        if not self.accelerator.is_main_process:
            return None
        cfg = self.cfg.eval
        began = time.perf_counter()
        result = self.worker.evaluate(
            cfg.num_examples, cfg.rollouts_per_example, timeout_s=self._rank0_deadline_s
        )
        metrics = {
            "eval/reward": result.reward,
            **{f"eval/{k}": v for k, v in result.metrics.items()},
            "eval/rollouts": result.num_rollouts,
            "eval/errored": result.errored,
            "eval/truncated": result.truncated,
            "eval/time": time.perf_counter() - began,
        }
        self.logger.log(step, metrics)
        self.logger.print(f"eval at step {step}: reward {result.reward:.4f}")
        return metrics

    def save(self, step: int) -> Path:
        state = {
            "step": step,
            "data_position": self.data_position,
            "weight_version": self.version,
            "wandb_run_id": self.logger.run_id if self.logger else None,
        }
        in_flight = []
        if self.worker is not None and self.cfg.batch.async_level:
            in_flight = self.worker.in_flight(step, timeout_s=self._rank0_deadline_s)
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
            self.reasoning_vocab,
        )
        self.logger.print(f"final {'adapter' if self.cfg.lora.enabled else 'model'}: {final}")
        return final

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.sync is not None:
            self.sync.close()
        if self.logger is not None:
            self.logger.close()
