"""The step time users see: real training runs against vf-vllm with prefix sharing on and off.

`bench/train_step.py --parts e2e` runs this. Each shape trains twice through scripts/train.py,
as a user runs it, from the same seed against the same vf-vllm: once with
`batch.prefix_sharing=true` (the default: the trainer folds a step into prefix trees when that
pays) and once with `false`. The runs are synchronous (async_level 0), so a step's parts add up
to its time: waiting for the rollouts (generation and scoring), forward/backward, optimizer,
weight push. The first step warms caches up and is dropped. Per shape:

    e2e_prefix_speedup = mean step seconds unshared / mean step seconds shared

The sampled completions are the same in both runs only up to the first push (sampling is
seeded, the pushed weights differ in their last bits), so each run's tokens per step are
reported beside its time.

Shapes:
- `gsm8k-b8`, `gsm8k-b64`: GSM8K test questions (../shared/data/gsm8k) under vf-deepscaler's
  boxed-answer rubric, SmolLM2-135M full fine-tune, 8 rollouts of at most 128 tokens a question,
  batches of 8 and 64 rollouts.
- `musique`: vf-musique with its tools (BM25, 2 documents a search, up to 5 turns), token-in
  (a rollout trains as one sample), LoRA, 2 questions x 8 rollouts.
- `tic-tac-toe`: vf-openspiel whole games against the random opponent, LoRA, 8 positions x 8.

The base SmolLM2 never calls MuSiQue's tools or writes a legal move, so its rollouts end in the
first turn. Both multi-turn shapes therefore start from the learning benches' SFT adapters
(bench/learning_musique.py, bench/learning_openspiel.py) when those exist under outputs/, and
say so in the results; without them they run from the base model.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import ROOT, STEP_PARTS, run_script
from learning_openspiel import WHOLE_GAMES

DATA = ROOT.parent / "shared" / "data"
EXAMPLES = ROOT / "configs" / "examples"
SHAPES = ("gsm8k-b8", "gsm8k-b64", "musique", "tic-tac-toe")
TIC_TAC_TOE_GAMES = (
    *(f"env.args.{key}={value}" for key, value in WHOLE_GAMES.items()),
    "batch.batch_size=64",
)
"""The tic-tac-toe shape's overrides of its recipe (which trains single moves): whole games of
8 positions x 8, the multi-turn shape whose turns share their prefixes, as measured before."""


@dataclass(frozen=True)
class Shape:
    """One end-to-end shape: a recipe and the overrides that size it."""

    name: str
    config: Path
    overrides: tuple[str, ...]
    adapter: Path | None = None
    """An SFT adapter to start from when it exists (multi-turn shapes; see the docstring)."""


def gsm8k_rows(out: Path) -> Path:
    """GSM8K's test questions as vf-deepscaler rows (`problem`, `answer`: the number after ####),
    written under `out` (the data stay in ../shared)."""
    rows = []
    for line in (DATA / "gsm8k" / "test.jsonl").read_text().splitlines():
        row = json.loads(line)
        answer = row["answer"].rsplit("####", 1)[-1].strip().replace(",", "")
        rows.append(json.dumps({"problem": row["question"], "answer": answer}))
    path = out / "gsm8k.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


def shapes(out: Path) -> list[Shape]:
    """Every end-to-end shape (in the order of SHAPES), its data files written under `out`."""
    gsm8k = gsm8k_rows(out)
    gsm8k_overrides = (
        f"env.args={{data_files: '{gsm8k}', max_examples: 400}}",
        "lora.enabled=false",
        "optim.lr=1e-6",
        "batch.rollouts_per_example=8",
        "sampling.max_tokens=128",
    )
    common = (
        "batch.async_level=0",
        "batch.dynamic_sampling=false",  # a refill round would time the draw, not the layout
        "checkpoint.every=0",
        "eval.every=0",  # evaluations run between steps: time the bench waits, not a step part
        "eval.at_start=false",
        "wandb.mode=disabled",
        "seed=0",
    )
    musique = DATA / "musique" / "dev_sample.jsonl"
    return [
        *(
            Shape(
                f"gsm8k-b{batch}",
                EXAMPLES / "deepscaler_smollm2_cpu.yaml",
                (*gsm8k_overrides, f"batch.batch_size={batch}", *common),
            )
            for batch in (8, 64)
        ),
        Shape(
            "musique",
            EXAMPLES / "learn_musique_smollm2_cpu.yaml",
            (f"env.args.data_files={musique}", *common),
            ROOT / "outputs" / "learn-musique" / "sft" / "final",
        ),
        Shape(
            "tic-tac-toe",
            EXAMPLES / "learn_openspiel_smollm2_cpu.yaml",
            (*TIC_TAC_TOE_GAMES, *common),
            ROOT / "outputs" / "learn-openspiel" / "sft" / "final",
        ),
    ]


def start_from(shape: Shape) -> tuple[str, ...]:
    """The override that picks the shape's starting adapter: the SFT adapter, or none."""
    if shape.adapter is None:
        return ()
    if (shape.adapter / "adapter_model.safetensors").exists():
        return (f"lora.resume_from={shape.adapter}",)
    return ("lora.resume_from=null",)


def timed_run(shape: Shape, sharing: bool, base_url: str, steps: int, out: Path) -> dict:
    """One training run of `shape`; the mean of each step part over the measured steps."""
    overrides = [
        *shape.overrides,
        *start_from(shape),
        f"batch.prefix_sharing={str(sharing).lower()}",
        f"server.base_url={base_url}",
        f"max_steps={steps + 1}",
        "logging.progress_bar=false",
    ]
    run_script("train.py", shape.config, out, overrides)
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = history[1:]

    def mean(key: str) -> float:
        return statistics.fmean(h[key] for h in steady)

    batch_tokens = [h["throughput/train_tokens_per_s"] * h["time/forward_backward"] for h in steady]
    return {
        "prefix_sharing": sharing,
        "steps_measured": len(steady),
        "step_s": mean("time/step"),
        **{key: mean(key) for key in STEP_PARTS},
        "samples_per_step": mean("rollouts/samples"),
        "rollouts_per_step": mean("rollouts/count"),
        "turns_per_rollout": mean("rollouts/turns"),
        "completion_tokens_per_step": mean("rollouts/completion_tokens"),
        "trainer_tokens_per_step": statistics.fmean(batch_tokens),
        "prefix_saved_frac": mean("throughput/prefix_saved_frac"),
        "memory_peak_gib": max(h["memory/peak_gib"] for h in steady),
    }


def compare(shape: Shape, base_url: str, steps: int, first_shared: bool, out: Path) -> dict:
    """The shape trained with prefix sharing on and off (in the given order)."""
    order = (True, False) if first_shared else (False, True)
    runs = {
        sharing: timed_run(shape, sharing, base_url, steps, out / f"{shape.name}-{sharing}")
        for sharing in order
    }
    shared, unshared = runs[True], runs[False]
    return {
        "start": start_from(shape) or ("base model",),
        "shared": shared,
        "unshared": unshared,
        "e2e_prefix_speedup": unshared["step_s"] / shared["step_s"],
    }


def run(base_url: str, names: list[str], steps: int) -> dict:
    """Every named shape, sharing on and off, the order alternating from shape to shape."""
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        chosen = [s for s in shapes(Path(tmp)) if s.name in names]
        for i, shape in enumerate(chosen):
            print(f"end to end, {shape.name}:", flush=True)
            results[shape.name] = compare(shape, base_url, steps, i % 2 == 0, Path(tmp))
            print_shape(shape.name, results[shape.name])
    return results


def print_shape(name: str, result: dict) -> None:
    print(
        f"{'sharing':>8} {'step s':>7} {'wait':>6} {'fwd/bwd':>7} {'optim':>6} {'push':>6}"
        f" {'samples':>7} {'turns':>5} {'trainer tok':>11} {'saved':>6} {'peak GiB':>8}"
    )
    for label in ("shared", "unshared"):
        r = result[label]
        print(
            f"{label:>8} {r['step_s']:7.2f} {r['time/wait_rollouts']:6.2f} "
            f"{r['time/forward_backward']:7.2f} {r['time/optimizer']:6.2f} "
            f"{r['time/weight_push']:6.2f} {r['samples_per_step']:7.1f} "
            f"{r['turns_per_rollout']:5.2f} {r['trainer_tokens_per_step']:11.0f} "
            f"{r['prefix_saved_frac']:6.1%} {r['memory_peak_gib']:8.2f}"
        )
    print(f"e2e_prefix_speedup_{name}={result['e2e_prefix_speedup']:.2f}", flush=True)
