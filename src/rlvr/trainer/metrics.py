"""Run logging: a progress bar, W&B (offline unless a key is set, or disabled), and local
`metrics.jsonl` / `samples.jsonl` files that hold the same numbers whatever W&B does.

Only the main process logs. Metric names are grouped by prefix (GRPO: `reward/`, `env/<metric>`,
`loss/`, `ratio/`, `time/`, `throughput/`, `rollouts/`, `batch/`, `push/`, `eval/`; SFT:
`train/`, `val/`, `data/`) so W&B's panels sort them. Any trainer's config works: the logger
reads its `output_dir` and `wandb` sections and records the whole config with the W&B run.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from rlvr.config import Config, SFTConfig, WandbConfig, to_dict
from rlvr.finite import finite_number

log = logging.getLogger(__name__)

T = TypeVar("T")

PROGRESS_KEYS = {
    "reward/mean": "reward",
    "train/loss": "loss",
    "time/step": "step_s",
    "mismatch_kl": "kl",
}


def wandb_mode(cfg: WandbConfig) -> str:
    """`auto` means online with a key and offline without: runs never fail for lack of one."""
    if cfg.mode != "auto":
        return cfg.mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def distribution(prefix: str, values: Iterable[Any]) -> dict[str, float]:
    """Mean, population std, min and max of the finite numbers among `values` (others are
    left out: `statistics.pstdev` raises a riddle on NaN); empty when there are none."""
    finite = [x for x in map(finite_number, values) if x is not None]
    if not finite:
        return {}
    return {
        f"{prefix}/mean": statistics.fmean(finite),
        f"{prefix}/std": statistics.pstdev(finite),
        f"{prefix}/min": min(finite),
        f"{prefix}/max": max(finite),
    }


class Laps:
    """The seconds a step spends in each named part, timed one after the other."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def time(self, name: str, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)`, its seconds recorded as `name`."""
        start = time.perf_counter()
        result = work(*args)
        self.seconds[name] = time.perf_counter() - start
        return result

    def elapsed(self) -> float:
        """Seconds since the step began."""
        return time.perf_counter() - self.began


def distill_wait(metrics: dict[str, float], waited: float, step_s: float) -> dict[str, float]:
    """`distill/wait_share`: the share of the step's wall time the trainer spent waiting for
    the teacher alone. The teacher grades each group as it finishes, so it holds the trainer up
    only by how much later the batch was ready than its last group was generated
    (`distill/teacher_wait_s`), and only while the trainer was waiting for the batch at all
    (`waited`: none when the batch was ready first, as under `batch.async_level` >= 1)."""
    if "distill/teacher_wait_s" not in metrics:
        return {}
    return {"distill/wait_share": min(metrics["distill/teacher_wait_s"], waited) / step_s}


def step_line(step: int, total: int, metrics: dict[str, float]) -> str:
    """The console line of a GRPO step when there is no progress bar (logs, `make demo`): the
    reward, the environment's own metrics (what it is made of; named as logged, since `env/loss`
    is a game's loss rate, not the training loss), mismatch-KL, or "nothing trained" for a step
    that had no signal and so measured none, the servers up of several, and the time."""
    env = "  ".join(f"{k} {v:.3g}" for k, v in metrics.items() if k.startswith("env/"))
    nan = float("nan")
    kl = metrics.get("mismatch_kl")
    servers = metrics.get("servers/total", 1)
    parts = [
        f"step {step}/{total}",
        f"reward {metrics.get('reward/mean', nan):.3f}",
        env,
        "nothing trained" if kl is None else f"mismatch-KL {kl:.2g}",
        f"servers {metrics.get('servers/up', nan):.0f}/{servers:.0f}" if servers > 1 else "",
        f"{metrics.get('time/step', nan):.1f} s",
    ]
    return " | ".join(part for part in parts if part)


class RunLogger:
    """`bar=(description, total steps)` shows a progress bar that advances on every metrics
    record with `time/step`; None shows none."""

    def __init__(
        self,
        config: Config | SFTConfig,
        enabled: bool,
        start_step: int,
        run_id: str | None = None,
        bar: tuple[str, int] | None = None,
    ):
        self.cfg = config
        self.enabled = enabled
        self.out = Path(config.output_dir)
        self.run = None
        self.bar = None
        self.run_id = run_id
        if not enabled:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self._init_wandb(run_id)
        if bar is not None:
            from tqdm.auto import tqdm

            desc, total = bar
            self.bar = tqdm(total=total, initial=start_step, desc=desc, unit="step", leave=True)

    def _init_wandb(self, run_id: str | None) -> None:
        mode = wandb_mode(self.cfg.wandb)
        if mode == "disabled":
            return
        import wandb

        wcfg = self.cfg.wandb
        self.run = wandb.init(
            project=wcfg.project,
            entity=wcfg.entity,
            name=wcfg.name,
            tags=wcfg.tags or None,
            dir=str(self.out),
            id=run_id,
            resume="allow" if run_id else None,
            mode=mode,
            config=to_dict(self.cfg),
        )
        self.run_id = self.run.id
        log.info("W&B run %s (%s) in %s", self.run.id, mode, self.out)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Log one step's metrics (step = number of optimizer steps done)."""
        if not self.enabled:
            return
        clean = {k: float(v) for k, v in metrics.items() if v is not None}
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self.run is not None:
            self.run.log(clean, step=step)
        if self.bar is not None and "time/step" in clean:
            self.bar.update(1)
            self.bar.set_postfix(
                {short: f"{clean[k]:.4g}" for k, short in PROGRESS_KEYS.items() if k in clean}
            )

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A table of sample rollouts (prompt, completion, reward, advantage)."""
        if not self.enabled or not rows:
            return
        with open(self.out / "samples.jsonl", "a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")
        if self.run is not None:
            import wandb

            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
            self.run.log({"samples": table}, step=step)

    def warn(self, message: str) -> None:
        log.warning(message)
        if self.bar is not None:
            self.bar.write(f"WARNING: {message}")

    def print(self, message: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.run is not None:
            self.run.finish()


def mismatch_warning(step: int, metrics: dict[str, float], limit: float) -> str | None:
    """The warning when a batch sampled by the weights it trains has a mismatch-KL over `limit`.

    Only such a batch (policy lag 0) measures what the sampler and the trainer disagree on;
    with lag it also measures how far the policy moved since, and the push checks cover it."""
    kl = metrics.get("mismatch_kl", 0.0)
    if not (kl > limit and metrics["rollouts/policy_lag"] == 0):
        return None
    return (
        f"step {step}: mismatch-KL {kl:.3g} between vf-vllm's sampling logprobs and the "
        f"trainer's exceeds {limit:g} on a batch sampled by the weights it trains: the server "
        "samples differently from what the trainer computes (sampling settings, precision) or "
        "weights did not arrive"
    )


def split_warning(step: int, metrics: dict[str, float]) -> str | None:
    """The warning when loss tokens belong to rollouts split across micro-batches."""
    split = metrics.get("ratio/split_rollout_frac", 0.0)
    if split <= 0:
        return None
    return (
        f"step {step}: {split:.1%} of the loss tokens belong to rollouts whose samples landed "
        "in different micro-batches, where each part takes its own sequence-level "
        "(GSPO or MIS) ratio (docs/training.md#loss-choices): set rollouts.token_in=true or "
        "raise batch.micro_batch_tokens"
    )
