"""Several inference servers (`server.base_urls`): a short GRPO run on 1 vs 2 vf-vllm servers at
the same total CPU threads, push seconds to 1 vs 2, and the time from a server's death to the
run going on.

The tiny model (`rlvr.model.tiny_model`) trains on `tests/toy_env.py`'s target-share task,
synchronously (async_level 0, so a step's parts add up to it), full fine-tune, merged pushes.
Replies ignore EOS, so every rollout generates exactly `--max-tokens` tokens and both settings
do the same work. The machine's cores are split by `VLLM_CPU_OMP_THREADS_BIND`: one server on
all of them, or two servers on half each. The first step warms up and is dropped. Measured:

1. generated tokens/s (the sum of `servers/<i>/tokens_per_s`) and step seconds, 1 vs 2 servers;
   `scaling_efficiency` = tokens/s with 2 servers / tokens/s with 1, at equal total threads,
   and tokens/s per server thread. On a machine whose cores the servers share, two servers
   cannot be faster than one when generation is compute-bound: the efficiency is the ratio
   that carries to GPUs (one server per GPU), where each server brings its own device. The
   tiny model is not compute-bound: each server's engine loop (one core of Python) bounds it,
   so one server leaves its second thread mostly idle and two servers come out faster;
   `--model smollm2-135m` measures a compute-bound model (slower).
2. push seconds (`time/weight_push`, `push/<i>/seconds`), 2 servers / 1 server.
3. a server SIGKILLed while it generates the groups of step 2 (of the 2-server setting): the
   seconds from the kill to that step's end, and the step's time against the undisturbed
   2-server step (`rollouts/retried_groups` says how many groups ran again).

Run (11 minutes on 2 cores shared with other work at load 6; `--steps`, `--examples` and
`--max-tokens` shrink or grow it):

    .venv/bin/python bench/servers.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, STEP_PARTS, save  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from toy_env import target_share_env  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from rlvr.config import load_config  # noqa: E402
from rlvr.model.names import resolve_model  # noqa: E402
from rlvr.model.tiny_model import build_tiny_model  # noqa: E402
from rlvr.server.launcher import cpu_thread_binding  # noqa: E402
from rlvr.server.process import EXACT_FLAGS, VLLMServer  # noqa: E402
from rlvr.trainer.grpo import Trainer  # noqa: E402
from rlvr.trainer.push_probes import Pushed  # noqa: E402

ROLLOUTS_PER_EXAMPLE = 8
KILL_STEP = 2
"""The step during which a server is killed: its groups are routed after the push of version 1."""


class TimedTrainer(Trainer):
    """A Trainer that records when each weight version's push returned (`pushed_at`: the end
    of the step that trained it) and, given a server to `kill`, SIGKILLs it `kill_after_s`
    after the run's last server starts generating a group of step `KILL_STEP`."""

    def __init__(
        self, config: Any, env: Any, kill: VLLMServer | None = None, kill_after_s: float = 0.0
    ):
        super().__init__(config, env=env)
        self.pushed_at: dict[int, float] = {}
        self.kill, self.kill_after_s = kill, kill_after_s
        self.killed_at = float("nan")

    def push_weights(self, version: int, initial: bool = False) -> Pushed:
        pushed = super().push_weights(version, initial)
        self.pushed_at[version] = time.perf_counter()
        if self.kill is not None and version == KILL_STEP - 1:
            threading.Thread(target=self._kill_when_busy, daemon=True).start()
        return pushed

    def _kill_when_busy(self) -> None:
        """Wait until the last server generates a group, then kill it mid-generation."""
        assert self.kill is not None
        busy = self.pool.servers[-1]
        deadline = time.monotonic() + 120
        while busy.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(self.kill_after_s)
        self.kill.kill()
        self.killed_at = time.perf_counter()


def model_directory(model: str, work: Path) -> Path:
    """The directory of `model`: "tiny" builds the tiny model under `work`."""
    if model == "tiny":
        return build_tiny_model(work / "tiny-qwen2")
    return Path(resolve_model(model))


def thread_slices(servers: int, threads: int) -> list[str]:
    """`VLLM_CPU_OMP_THREADS_BIND` of each of `servers` servers: the first `threads` cores of
    this process, split evenly (launcher.cpu_thread_binding)."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    return cpu_thread_binding(servers, cores).split("|")


@contextmanager
def serving(model_dir: Path, servers: int, threads: int) -> Iterator[list[VLLMServer]]:
    """`servers` vf-vllm servers on `model_dir`, `threads` cores in all, split evenly, all
    stopped on the way out; their logs stay in /tmp/vf-vllm-<port>.log. They start one after
    the other, from this thread: a server dies with the thread that started it (its
    parent-death signal, rlvr.server.lifetime), so a thread pool cannot start them."""
    with ExitStack() as stack:
        started = []
        for cores in thread_slices(servers, threads):
            env = {"VLLM_CPU_OMP_THREADS_BIND": cores}
            server = VLLMServer(str(model_dir), extra_args=EXACT_FLAGS, env=env)
            started.append(stack.enter_context(server))
        yield started


def config(
    model_dir: Path, servers: list[VLLMServer], out: Path, args: argparse.Namespace, steps: int
) -> Any:
    """The run's config: `steps` steps of `args`' size on `servers`, full fine-tune,
    synchronous, seeded."""
    return load_config(
        overrides=[
            f"model.name={model_dir}",
            f"max_steps={steps}",
            "server.base_url=null",
            f"server.base_urls=[{', '.join(s.base_url for s in servers)}]",
            f"server.served_model={servers[0].model}",
            f"batch.batch_size={args.examples * ROLLOUTS_PER_EXAMPLE}",
            f"batch.rollouts_per_example={ROLLOUTS_PER_EXAMPLE}",
            "batch.micro_batch_size=16",
            "batch.async_level=0",
            "batch.dynamic_sampling=false",
            f"sampling.max_tokens={args.max_tokens}",
            "sampling.extra_body={ignore_eos: true}",
            "lora.enabled=false",
            "optim.lr=1e-3",
            "seed=0",
            "wandb.mode=disabled",
            "logging.progress_bar=false",
            "checkpoint.every=0",
            "eval.every=0",
            "eval.at_start=false",
            f"output_dir={out}",
        ]
    )


def train(
    model_dir: Path,
    servers: list[VLLMServer],
    out: Path,
    args: argparse.Namespace,
    steps: int,
    kill: VLLMServer | None = None,
) -> tuple[TimedTrainer, list[dict]]:
    """`steps` steps on `servers` (`kill` SIGKILLed in step `KILL_STEP`); the trainer and the
    history."""
    target = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("42")
    cfg = config(model_dir, servers, out, args, steps)
    env = target_share_env(target, args.examples)
    trainer = TimedTrainer(cfg, env, kill=kill, kill_after_s=args.kill_after)
    return trainer, trainer.run()


def mean(history: list[dict], key: str) -> float:
    return statistics.fmean(h[key] for h in history)


def steady(history: list[dict], servers: int, threads: int) -> dict:
    """Means over the steps after the first: step parts, tokens/s in all and per server thread,
    push seconds in all and per server."""
    measured = history[1:]
    per_server = [mean(measured, f"servers/{i}/tokens_per_s") for i in range(servers)]
    tokens_per_s = sum(per_server)
    return {
        "servers": servers,
        "threads": threads,
        "steps_measured": len(measured),
        "step_s": mean(measured, "time/step"),
        **{key: mean(measured, key) for key in STEP_PARTS},
        "completion_tokens_per_step": mean(measured, "rollouts/completion_tokens"),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_server": per_server,
        "tokens_per_s_per_thread": tokens_per_s / threads,
        "push_s_per_server": [mean(measured, f"push/{i}/seconds") for i in range(servers)],
        "groups_per_server": [mean(measured, f"servers/{i}/groups") for i in range(servers)],
    }


def killed_run(
    model_dir: Path, servers: list[VLLMServer], out: Path, args: argparse.Namespace
) -> dict:
    """`KILL_STEP` steps on `servers`, the last server SIGKILLed mid-generation in the last step:
    seconds from the kill to the step's end, and that step's parts."""
    trainer, history = train(model_dir, servers, out, args, KILL_STEP, kill=servers[-1])
    step = history[KILL_STEP - 1]
    after_kill = trainer.pushed_at[KILL_STEP] - trainer.killed_at
    training = step["time/forward_backward"] + step["time/optimizer"] + step["time/weight_push"]
    return {
        "kill_after_s": args.kill_after,
        "kill_to_step_end_s": after_kill,
        "kill_to_rollouts_done_s": after_kill - training,
        "step_s": step["time/step"],
        **{key: step[key] for key in STEP_PARTS},
        "retried_groups": step["rollouts/retried_groups"],
        "servers_up_after": step["servers/up"],
        "groups_per_server": [step[f"servers/{i}/groups"] for i in range(len(servers))],
    }


def report(one: dict, two: dict, killed: dict, threads: int) -> dict:
    """The ratios against the same run's baselines, printed."""
    ratios = {
        "scaling_efficiency": two["tokens_per_s"] / one["tokens_per_s"],
        "step_time_ratio_2_vs_1": two["step_s"] / one["step_s"],
        "push_ratio_2_vs_1": two["time/weight_push"] / one["time/weight_push"],
        "killed_step_vs_undisturbed": killed["step_s"] / two["step_s"],
        "killed_wait_rollouts_vs_undisturbed": killed["time/wait_rollouts"]
        / two["time/wait_rollouts"],
    }
    print(f"{'servers':>7} {'threads':>7} {'step s':>7} {'wait':>6} {'push':>6} {'tok/s':>7}")
    for r in (one, two):
        print(
            f"{r['servers']:>7} {r['threads']:>7} {r['step_s']:7.2f} "
            f"{r['time/wait_rollouts']:6.2f} {r['time/weight_push']:6.2f} {r['tokens_per_s']:7.1f}"
        )
        per_server = ", ".join(f"{t:.1f}" for t in r["tokens_per_s_per_server"])
        pushes = ", ".join(f"{t:.3f}" for t in r["push_s_per_server"])
        print(f"        per server: tokens/s {per_server}; push s {pushes}")
    for key, value in ratios.items():
        print(f"{key}={value:.3f}")
    print(
        f"per server thread: {one['tokens_per_s_per_thread']:.1f} tokens/s (1 server) vs "
        f"{two['tokens_per_s_per_thread']:.1f} (2 servers)"
    )
    print(
        f"on {threads} shared cores two servers cannot be faster than one where generation is"
        " compute-bound; a model too small for that is bound by each server's one-core engine"
        " loop, which a second server doubles. scaling_efficiency (tokens/s per server thread,"
        " 2 servers / 1) is the ratio that carries to GPUs (one server per device)"
    )
    print(
        f"server killed {killed['kill_after_s']:.1f} s into its step-{KILL_STEP} generation: "
        f"{killed['retried_groups']:.0f} groups retried, kill -> rollouts done "
        f"{killed['kill_to_rollouts_done_s']:.2f} s, kill -> step end "
        f"{killed['kill_to_step_end_s']:.2f} s; step {killed['step_s']:.2f} s vs "
        f"{two['step_s']:.2f} s undisturbed",
        flush=True,
    )
    return ratios


def phase(began: float, text: str) -> None:
    """Print `text` after the seconds since `began`."""
    print(f"[{time.perf_counter() - began:.0f} s] {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="tiny",
        help="tiny (rlvr.model.tiny_model), or a model, e.g. smollm2-135m",
    )
    parser.add_argument("--steps", type=int, default=3, help="measured steps per setting")
    parser.add_argument("--examples", type=int, default=8, help="groups of 8 rollouts a step")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens every reply makes")
    parser.add_argument(
        "--threads", type=int, default=len(os.sched_getaffinity(0)), help="server threads in all"
    )
    parser.add_argument("--kill-after", type=float, default=0.5, help="seconds into generation")
    parser.add_argument("--out", default=None, help="JSON path (default bench/results/)")
    args = parser.parse_args()
    if args.threads < 2 or args.threads % 2:
        raise SystemExit("--threads must be even and at least 2 (two servers split them)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = model_directory(args.model, work)
        results = {}
        began = time.perf_counter()
        with serving(model_dir, 1, args.threads) as servers:
            phase(began, f"1 server, {args.threads} threads")
            _, history = train(model_dir, servers, work / "one", args, args.steps + 1)
            results["one_server"] = steady(history, 1, args.threads)
        with serving(model_dir, 2, args.threads) as servers:
            phase(began, f"2 servers, {args.threads // 2} threads each")
            _, history = train(model_dir, servers, work / "two", args, args.steps + 1)
            results["two_servers"] = steady(history, 2, args.threads)
            phase(began, f"2 servers, one SIGKILLed in step {KILL_STEP}")
            results["killed"] = killed_run(model_dir, servers, work / "killed", args)
    ratios = report(results["one_server"], results["two_servers"], results["killed"], args.threads)
    save(
        "servers",
        {
            "model": args.model,
            "examples": args.examples,
            "rollouts_per_example": ROLLOUTS_PER_EXAMPLE,
            "max_tokens": args.max_tokens,
            **results,
            **ratios,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
