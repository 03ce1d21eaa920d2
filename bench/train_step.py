"""GRPO step time on a shared CPU, in one run: the trainer's forward/backward with packed vs
padded micro-batches, and how generation should overlap training.

SmolLM2-135M (LoRA) on vf-deepscaler, trainer and vf-vllm on the same CPU.

1. Layouts. One synchronous run (async_level 0) times forward/backward on every step's
   samples three times, rotating which goes first: the trainer before issue 17 (the output
   head over every position, float32 log-softmax of the whole micro-batch, padding masked), the
   trainer now with packing off (rlvr.trainer.logprobs' chunked head; padded rows, causal attention
   without a mask) and with packing on (`batch.packing`). It reports each layout's
   padded-token fraction and trainer tokens/s (real tokens / forward-backward seconds) on the
   same samples, and the ratios. Its completions may run to `--layouts-max-tokens` (512) so
   that most end at EOS and lengths vary as in training; at 128 every completion is cut at the
   limit, the rollouts of a group have equal lengths, and no layout pads.
2. Overlap. vLLM's CPU worker binds every core but the last. Three runs: async_level 0 (the
   trainer waits for generation, then uses every core), async_level 1 on shared cores, and
   async_level 1 with the trainer pinned to the core vLLM leaves free (`batch.trainer_cores`).
   Each reports the step-time breakdown and generated tokens per second of wall time, also as
   a share of the raw vLLM throughput at the same concurrency (bench/serve_throughput.py):

       pipeline efficiency = training-time generation tokens/s / raw tokens/s

   and the bench names the fastest setting.
3. Sync. Two runs at async_level 1 against the same LoRA-enabled server: the trainer pushes
   only the adapter (`server.lora_sync=adapter`, rollouts request the adapter's name) or the
   merged model (`merged`, rollouts request the base name): step time, push time and
   generation tokens/s, so a LoRA serving cost that eats the push gain shows in the step time.
4. Prefix sharing (no server). The trainer's forward_backward (SmolLM2-135M, LoRA) on the
   same synthetic groups in three layouts, rotating which goes first: unshared, folded into
   prefix trees with the node split of `rlvr.layout.tree_sdpa` (the trainer's layout), and
   the same trees through one SDPA call per row with the dense W x W mask the trainer used
   before (the baseline: every query scored against every key of its row, then masked). The
   issue's shapes (prompt tokens, group size, completion tokens): (a) 1,000 / 8 / 128,
   (b) 470 / 8 / 90, (c) 150 / 8 / 128, (d) 60 / 8 / 256, all folded whatever
   `MIN_SHARED_FRACTION` and `MIN_SAVED_FRACTION` say, so that the numbers can set them.
   Micro-batches as the trainer bounds them by default (`batch.micro_batch_tokens` 4,096, no
   row cap), or at most `--prefix-micro-batch-size` rows; a folded micro-batch may hold no
   more than the unshared layout's largest, so a row cap also caps the tree (at 4 rows, (c)'s
   group of 8 folds into two trees, each placing the prompt).
   Seconds per step, the process's peak resident memory above its level before the pass (RSS,
   measured from after the C heap returned its free pages), tokens forwarded.
   Prints `prefix_sharing_speedup=` (a) and `prefix_sharing_speedup_<shape>=` for each shape
   (unshared / split), with the dense baseline's speedup and each layout's peak beside it.
5. End to end (`bench/step_e2e.py`). Real runs of scripts/train.py against one vf-vllm with
   prefix sharing on and off, same seed: GSM8K (full fine-tune, 8 rollouts x <= 128 tokens,
   batches of 8 and 64), vf-musique with its tools, tic-tac-toe. Each step's parts (wait for
   rollouts, forward/backward, optimizer, push) and `e2e_prefix_speedup_<shape>=` per shape.

Run:  .venv/bin/python bench/train_step.py [--steps 4] [--batch-size 16] [--max-tokens 128]
          [--layouts-max-tokens 512] [--parts layouts overlap sync prefix]
          [--prefix-shapes a b c d] [--prefix-repeats 2] [--prefix-micro-batch-size N]
          [--e2e-shapes gsm8k-b8 gsm8k-b64 musique tic-tac-toe] [--e2e-steps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_e2e  # noqa: E402
from common import SERVER_FLAGS, STEP_PARTS, machine, save  # noqa: E402
from serve_throughput import measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "deepscaler" / "preview_first803.jsonl"


def config(base_url: str, args: argparse.Namespace, out: Path, *extra: str):
    from rlvr.config import load_config

    return load_config(
        overrides=[
            "env.id=vf-deepscaler",
            f"env.args={{data_files: '{DATA}', max_examples: 200}}",
            "model.name=smollm2-135m",
            f"server.base_url={base_url}",
            f"batch.batch_size={args.batch_size}",
            f"batch.rollouts_per_example={args.group}",
            f"batch.micro_batch_size={args.micro_batch_size}",
            "batch.max_seq_len=1024",
            "batch.max_prompt_len=512",
            f"sampling.max_tokens={args.max_tokens}",
            f"max_steps={args.steps + 1}",
            "optim.lr=5e-5",
            "wandb.mode=disabled",
            "logging.progress_bar=false",
            "checkpoint.every=0",
            f"output_dir={out}",
            *extra,
        ]
    )


def full_logits_scores(model, mb, temperature=1.0, *, with_entropy=False, mask_logits=None):
    """The trainer's scoring before issue 17: the head over every position, float32 as a whole,
    padding masked."""
    from logprob_memory import full_logits

    from rlvr.trainer.logprobs import TokenScores

    return TokenScores(*full_logits(model, mb, temperature))


# (name, batch.packing, how micro_batch_loss scores tokens); the first is the baseline
LAYOUTS = (
    ("before: full logits", False, full_logits_scores),
    ("packing off", False, None),
    ("packing on", True, None),
)


def compare_layouts(base_url: str, args: argparse.Namespace, out: Path) -> dict:
    """Every layout's forward/backward on the same samples, every step (see the docstring)."""
    import rlvr.trainer.grpo
    import rlvr.trainer.step
    from rlvr.layout.micro_batches import rank_micro_batches, slot_count

    chunked = rlvr.trainer.step.sequence_scores
    timings: list[dict] = []

    class TimedLayouts(rlvr.trainer.grpo.Trainer):
        def forward_backward(self, batch):
            samples, tokens = batch.samples, batch.tokens
            row: dict = {"tokens": tokens}
            turn = len(timings) % len(LAYOUTS)  # rotate which layout goes first
            for name, packing, scorer in LAYOUTS[turn:] + LAYOUTS[:turn]:
                self.cfg.batch.packing = packing
                rlvr.trainer.step.sequence_scores = scorer or chunked
                plan = rank_micro_batches(
                    samples, 0, 1, self.cfg.batch.micro_batch_size, 0, packing
                )
                self.model.zero_grad()
                began = time.perf_counter()
                try:
                    trained = super().forward_backward(batch)
                finally:
                    rlvr.trainer.step.sequence_scores = chunked
                seconds = time.perf_counter() - began
                row[name] = {
                    "seconds": seconds,
                    "padded_frac": 1 - tokens / sum(slot_count(mb) for mb in plan),
                    "micro_batches": len(plan),
                    "loss": trained.stats["loss/total"],
                }
            timings.append(row)
            per_layout = "; ".join(
                f"{name} {row[name]['seconds']:.1f} s ({row[name]['padded_frac']:.0%} padding)"
                for name, _, _ in LAYOUTS
            )
            print(f"  step {len(timings)}: {tokens} tokens; {per_layout}", flush=True)
            return trained

    overrides = ("batch.async_level=0", f"sampling.max_tokens={args.layouts_max_tokens}")
    TimedLayouts(config(base_url, args, out, *overrides)).run()
    steady = timings[1:]  # the first step warms caches up
    tokens = sum(t["tokens"] for t in steady)
    summary = {
        name: {
            "tokens_per_s": tokens / sum(t[name]["seconds"] for t in steady),
            "padded_frac": statistics.fmean(t[name]["padded_frac"] for t in steady),
            "seconds_per_step": statistics.fmean(t[name]["seconds"] for t in steady),
        }
        for name, _, _ in LAYOUTS
    }
    baseline = summary[LAYOUTS[0][0]]["tokens_per_s"]
    for name in summary:
        summary[name]["speedup_vs_baseline"] = summary[name]["tokens_per_s"] / baseline
    padded, packed = (summary[LAYOUTS[i][0]]["tokens_per_s"] for i in (1, 2))
    return {
        "steps": timings,
        "layouts": summary,
        "packed_vs_padded": packed / padded,
        "default_vs_before": padded / baseline,
    }


def overlap_run(base_url: str, args: argparse.Namespace, name: str, out: Path, *extra) -> dict:
    import torch

    from rlvr.trainer.cores import set_affinity
    from rlvr.trainer.grpo import Trainer

    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        history = Trainer(config(base_url, args, out, *extra)).run()
    finally:  # the trainer runs in this process: undo its pinning for the next run
        set_affinity(cores)
        torch.set_num_threads(threads)
    steady = history[1:]  # the first step warms caches up and has nothing to overlap with
    tokens = sum(h["rollouts/completion_tokens"] for h in steady)
    wall = sum(h["time/step"] for h in steady)
    return {
        "setting": name,
        "overrides": list(extra),
        "steps_measured": len(steady),
        "step_s": statistics.fmean(h["time/step"] for h in steady),
        **{key: statistics.fmean(h[key] for h in steady) for key in STEP_PARTS},
        "generate_s": statistics.fmean(h["time/generate"] for h in steady),
        "completion_tokens_per_step": tokens / len(steady),
        "pipeline_tokens_per_s": tokens / wall,
        "padded_frac": statistics.fmean(h["throughput/padded_frac"] for h in steady),
        "mismatch_kl_max": max(  # null when no step trained: a step without signal measures none
            (h["mismatch_kl"] for h in steady if "mismatch_kl" in h), default=None
        ),
        "reward_per_step": [h["reward/mean"] for h in history],
    }


def timed_runs(base_url: str, args, settings: list, out: Path, raw: dict) -> list[dict]:
    """`overlap_run` for each (name, overrides), with its share of the raw vLLM throughput."""
    runs = [
        overlap_run(base_url, args, name, out / str(i), *extra)
        for i, (name, extra) in enumerate(settings)
    ]
    for r in runs:
        r["pipeline_efficiency"] = r["pipeline_tokens_per_s"] / raw["tokens_per_s"]
    return runs


def prompts() -> list[str]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines()[:64]]
    suffix = "\nPut the final answer in \\boxed{}."
    return [row["problem"] + suffix for row in rows]


def run(base_url: str, args: argparse.Namespace) -> dict:
    raw = asyncio.run(
        measure(
            base_url,
            "smollm2-135m",
            args.batch_size,
            args.batch_size * 2,
            args.max_tokens,
            prompts(),
        )
    )
    print(
        f"raw vLLM at concurrency {args.batch_size}: {raw['tokens_per_s']:.1f} tokens/s", flush=True
    )
    free_core = max(os.sched_getaffinity(0))
    settings = [
        ("async 0", ["batch.async_level=0"]),
        ("async 1, shared cores", ["batch.async_level=1"]),
        (
            f"async 1, trainer on core {free_core}",
            ["batch.async_level=1", f"batch.trainer_cores=[{free_core}]"],
        ),
    ]
    syncs = [
        (f"async 1, {mode} sync", ["batch.async_level=1", f"server.lora_sync={mode}"])
        for mode in ("adapter", "merged")
    ]
    payload: dict = {"raw": raw}
    with tempfile.TemporaryDirectory() as tmp:
        if "layouts" in args.parts:
            print("layouts (async_level 0, every layout on each step's samples):", flush=True)
            payload["layouts"] = compare_layouts(base_url, args, Path(tmp) / "layouts")
            print_layouts(payload["layouts"])
        if "overlap" in args.parts:
            runs = timed_runs(base_url, args, settings, Path(tmp) / "overlap", raw)
            payload.update(runs=runs, fastest=print_overlap(runs))
        if "sync" in args.parts:
            runs = timed_runs(base_url, args, syncs, Path(tmp) / "sync", raw)
            adapter, merged = runs
            payload.update(
                sync_runs=runs,
                adapter_push_speedup=merged["time/weight_push"] / adapter["time/weight_push"],
                adapter_step_speedup=merged["step_s"] / adapter["step_s"],
            )
            print_overlap(runs)
            print(
                f"adapter vs merged sync: push {payload['adapter_push_speedup']:.1f}x faster, "
                f"step {payload['adapter_step_speedup']:.2f}x"
            )
    return payload


# (name, prompt tokens, completion tokens)
PREFIX_SHAPES = (
    ("a: long prompt", 1000, 128),
    ("b: tool schemas", 470, 90),
    ("c: gsm8k-like", 150, 128),
    ("d: short prompt, long answers", 60, 256),
)
PREFIX_LAYOUTS = ("unshared", "split", "dense")


class PeakRSS:
    """The process's peak resident memory above its level at entry, sampled every 5 ms (a
    CPU has no allocator statistics to reset between the passes being compared). At entry the
    C heap gives its free pages back (`malloc_trim`), so that a pass reusing memory an earlier
    one freed still shows what it needs."""

    def __enter__(self) -> PeakRSS:
        gc.collect()
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    @property
    def gib(self) -> float:
        return (self.peak - self.base) / 2**30


def prefix_trainer(args: argparse.Namespace, out: Path):
    """A Trainer with its policy and optimizer but no server or environment: only
    forward_backward runs. Gradient checkpointing on: without it the unshared layout of (a)
    needs ~8 GiB, more than a shared 2-core machine here spares."""
    from rlvr.config import load_config
    from rlvr.trainer.grpo import Trainer
    from rlvr.trainer.optimizer import Optimization, make_accelerator

    cfg = load_config(
        overrides=[
            "model.name=smollm2-135m",
            "wandb.mode=disabled",
            "model.gradient_checkpointing=true",
            f"batch.micro_batch_size={args.prefix_micro_batch_size or 'null'}",
            "batch.max_seq_len=4096",
            f"output_dir={out}",
        ]
    )
    trainer = Trainer(cfg)
    trainer.accelerator = make_accelerator(cfg.distributed.timeout_s)
    trainer.ds, trainer.rank, trainer.world = False, 0, 1
    trainer._load_policy()
    trainer.opt = Optimization(
        trainer.accelerator, trainer.model, cfg.optim, 1, cfg.batch.micro_batch_size or 1
    )
    trainer.model = trainer.opt.model
    return trainer


def prefix_group(prompt_len: int, completion_len: int, group: int, g) -> list:
    """One group's samples: a random prompt, `group` random completions (timing does not
    depend on which tokens they are)."""
    import torch

    from rlvr.batch import Sample

    prompt = torch.randint(100, 40000, (prompt_len,), generator=g).tolist()
    samples = []
    for _ in range(group):
        completion = torch.randint(100, 40000, (completion_len,), generator=g).tolist()
        mask = [0] * prompt_len + [1] * completion_len
        logprobs = [-1.0 * m for m in mask]
        samples.append(
            Sample(prompt + completion, mask, logprobs, float(torch.randn(1, generator=g)))
        )
    return samples


def dense_mask_collate(collate):
    """The folded collate of `rlvr.layout.folded` with the baseline's attention: no node
    plan, and the dense [R, 1, W, W] mask of the tree's rule, which transformers hands to
    SDPA as it is."""
    import torch

    from rlvr.layout.folded import FoldedMicroBatch, visibility

    class DenseMask(FoldedMicroBatch):
        def model_inputs(self) -> dict:
            rows, width = self.scope_end.shape
            b = torch.arange(rows, device=self.scope_end.device)[:, None, None]
            index = torch.arange(width, device=self.scope_end.device)
            mask = visibility(self.scope_end)(b, None, index[None, :, None], index[None, None, :])
            return {
                "input_ids": self.tree_ids,
                "position_ids": self.tree_positions,
                "attention_mask": mask[:, None],
            }

    def folded(*args, **kwargs):
        return DenseMask(**{**vars(collate(*args, **kwargs)), "tree_plan": None})

    return folded


def timed_pass(trainer, samples: list, layout: str) -> dict:
    """One forward_backward of `samples` in `layout` (see PREFIX_LAYOUTS), every sample that
    shares a prefix folded (both thresholds off) unless unshared."""
    import rlvr.layout.plan as plan
    import rlvr.layout.prefix_tree as prefix_tree
    from rlvr.batch import TrainBatch

    trainer.cfg.batch.prefix_sharing = layout != "unshared"
    trainer.model.zero_grad()
    batch = TrainBatch(samples, metrics={}, table=[], data_position=0)
    saved = (prefix_tree.MIN_SHARED_FRACTION, plan.MIN_SAVED_FRACTION, plan.collate_folded)
    prefix_tree.MIN_SHARED_FRACTION = plan.MIN_SAVED_FRACTION = 0.0
    if layout == "dense":
        plan.collate_folded = dense_mask_collate(saved[2])
    try:
        with PeakRSS() as memory:
            began = time.perf_counter()
            trained = trainer.forward_backward(batch)
            seconds = time.perf_counter() - began
    finally:
        prefix_tree.MIN_SHARED_FRACTION, plan.MIN_SAVED_FRACTION, plan.collate_folded = saved
    return {
        "seconds": seconds,
        "peak_gib": memory.gib,
        "forwarded": trained.forwarded,
        "slots": trained.slots,
        "loss": trained.stats["loss/total"],
    }


def compare_prefix_sharing(args: argparse.Namespace, out: Path) -> dict:
    """Split, unshared and dense-mask forward_backward on the same samples, per shape (see the
    docstring)."""
    import torch

    trainer = prefix_trainer(args, out)
    g = torch.Generator().manual_seed(0)
    warm = prefix_group(64, 16, args.prefix_group, g)
    for layout in PREFIX_LAYOUTS:
        timed_pass(trainer, warm, layout)
    results = {"machine_before": machine()}
    for name, prompt_len, completion_len in PREFIX_SHAPES:
        if name[0] not in args.prefix_shapes:
            continue
        groups = [
            prefix_group(prompt_len, completion_len, args.prefix_group, g)
            for _ in range(args.prefix_groups)
        ]
        samples = [s for group in groups for s in group]
        runs: dict[str, list[dict]] = {layout: [] for layout in PREFIX_LAYOUTS}
        for i in range(args.prefix_repeats):
            for j in range(len(PREFIX_LAYOUTS)):  # rotate which layout goes first
                layout = PREFIX_LAYOUTS[(i + j) % len(PREFIX_LAYOUTS)]
                runs[layout].append(timed_pass(trainer, samples, layout))
        row = {
            layout: {
                "seconds": statistics.fmean(r["seconds"] for r in rs),
                "peak_gib": max(r["peak_gib"] for r in rs),
                "forwarded_tokens": rs[0]["forwarded"],
                "slots": rs[0]["slots"],
                "loss": rs[0]["loss"],
            }
            for layout, rs in runs.items()
        }
        unshared = row["unshared"]["seconds"]
        row["speedup"] = unshared / row["split"]["seconds"]
        row["dense_speedup"] = unshared / row["dense"]["seconds"]
        row["tokens"] = sum(len(s) for s in samples)
        results[name] = row
        print(
            f"  {name}: {row['tokens']} tokens, folded {row['split']['forwarded_tokens']:.0f}; "
            f"unshared {unshared:.1f} s, split {row['split']['seconds']:.1f} s "
            f"({row['speedup']:.2f}x), dense mask {row['dense']['seconds']:.1f} s "
            f"({row['dense_speedup']:.2f}x); peak GiB unshared "
            f"{row['unshared']['peak_gib']:.2f}, split {row['split']['peak_gib']:.2f}, "
            f"dense {row['dense']['peak_gib']:.2f}; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        print(
            f"prefix_sharing_speedup_{name[0]}={row['speedup']:.2f} "
            f"(dense mask {row['dense_speedup']:.2f}, peak {row['split']['peak_gib']:.2f} GiB "
            f"vs unshared {row['unshared']['peak_gib']:.2f} GiB)",
            flush=True,
        )
    results["machine_after"] = machine()
    return results


def print_layouts(layouts: dict) -> None:
    print(f"\n{'layout':>22} {'padding':>8} {'fwd/bwd s':>9} {'trainer tok/s':>13} {'vs first':>8}")
    for name, r in layouts["layouts"].items():
        print(
            f"{name:>22} {r['padded_frac']:8.1%} {r['seconds_per_step']:9.2f} "
            f"{r['tokens_per_s']:13.1f} {r['speedup_vs_baseline']:7.2f}x"
        )
    print(f"trainer tokens/s, packing on / off: {layouts['packed_vs_padded']:.2f}x")
    print(f"trainer tokens/s, packing off / before issue 17: {layouts['default_vs_before']:.2f}x")


def print_overlap(runs: list[dict]) -> str:
    """The table of the overlap settings; returns the fastest one's name."""
    print(
        f"\n{'setting':>28} {'step s':>7} {'wait':>6} {'fwd/bwd':>7} {'optim':>6} {'push':>6}"
        f" {'gen tok/s':>9} {'efficiency':>10}"
    )
    for r in runs:
        print(
            f"{r['setting']:>28} {r['step_s']:7.2f} {r['time/wait_rollouts']:6.2f} "
            f"{r['time/forward_backward']:7.2f} {r['time/optimizer']:6.2f} "
            f"{r['time/weight_push']:6.2f} {r['pipeline_tokens_per_s']:9.1f} "
            f"{r['pipeline_efficiency']:10.2f}"
        )
    best = min(runs, key=lambda r: r["step_s"])
    print(f"fastest: {best['setting']} ({' '.join(best['overrides'])})")
    return best["setting"]


def end_to_end(args: argparse.Namespace) -> dict:
    """The e2e part: its own vf-vllm (the tests' flags: float32, tool calling, 4,096-token
    context), or --base-url."""
    if args.base_url:
        return step_e2e.run(args.base_url, args.e2e_shapes, args.e2e_steps)
    from rlvr.server.process import EXACT_FLAGS, VLLMServer

    with VLLMServer("smollm2-135m", extra_args=EXACT_FLAGS) as server:
        return step_e2e.run(server.base_url, args.e2e_shapes, args.e2e_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=None, help="an existing vf-vllm on smollm2-135m")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--layouts-max-tokens",
        type=int,
        default=512,
        help="the layouts part's completion limit (see the docstring)",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["layouts", "overlap", "sync", "prefix", "e2e"],
        default=["layouts", "overlap", "sync"],
    )
    parser.add_argument("--prefix-group", type=int, default=8, help="prefix part: group size")
    parser.add_argument("--prefix-groups", type=int, default=1, help="prefix part: groups a step")
    parser.add_argument(
        "--prefix-shapes",
        nargs="+",
        choices=[shape[0][0] for shape in PREFIX_SHAPES],
        default=[shape[0][0] for shape in PREFIX_SHAPES],
        help="prefix part: which of the shapes (a) to (d) to time",
    )
    parser.add_argument(
        "--prefix-micro-batch-size",
        type=int,
        default=None,
        help="prefix part: most rows a micro-batch (default: only micro_batch_tokens bounds)",
    )
    parser.add_argument(
        "--prefix-repeats",
        type=int,
        default=2,
        help="prefix part: timed passes per layout and shape",
    )
    parser.add_argument(
        "--e2e-shapes",
        nargs="+",
        choices=step_e2e.SHAPES,
        default=list(step_e2e.SHAPES),
        help="e2e part: which shapes to train",
    )
    parser.add_argument("--e2e-steps", type=int, default=2, help="e2e part: measured steps")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    payload: dict = {}
    if "prefix" in args.parts:
        print("prefix sharing (forward_backward, shared vs unshared, same samples):", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            payload["prefix_sharing"] = compare_prefix_sharing(args, Path(tmp))
        if PREFIX_SHAPES[0][0] in payload["prefix_sharing"]:
            speedup = payload["prefix_sharing"][PREFIX_SHAPES[0][0]]["speedup"]
            print(f"prefix_sharing_speedup={speedup:.2f}")
    if "e2e" in args.parts:
        payload["e2e"] = end_to_end(args)
    served = set(args.parts) - {"prefix", "e2e"}
    if served and args.base_url:
        payload.update(run(args.base_url, args))
    elif served:
        from rlvr.server.launcher import lora_flags
        from rlvr.server.process import VLLMServer

        flags = [*SERVER_FLAGS, *(lora_flags(16) if "sync" in args.parts else [])]
        with VLLMServer("smollm2-135m", extra_args=flags) as server:
            payload.update(run(server.base_url, args))
    name = "train_step" if served else "train_step_" + "_".join(sorted(args.parts))
    if not served and len(args.prefix_shapes) < len(PREFIX_SHAPES):  # keep the full run's
        name += "_" + "".join(args.prefix_shapes)
    save(name, {"model": "smollm2-135m", "env": "vf-deepscaler", **vars(args), **payload})


if __name__ == "__main__":
    main()
