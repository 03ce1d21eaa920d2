"""Does a reasoning vocabulary change what GRPO does? Baseline vs expanded, in one run.

Two short GRPO runs of the embedded SmolLM2-135M-Instruct on vf-deepscaler with generated
problems (bench/learning.py's small-number arithmetic, answers in `\\boxed{}`), the same seed,
steps, data and settings (configs/examples/reasoning_vocab_smollm2_cpu.yaml, whose system prompt
ends with `<think>`, so every completion starts inside a think span):

* **baseline**: the plain model;
* **expanded**: the model with `--size` reasoning ids (scripts/expand_vocab.py's checkpoint,
  made once under --out), served by vf-vllm with its think gate.

Each run gets its own vf-vllm (one at a time) and pushes weights after every step. Per step:
reward, completion length (tokens), thinking share (the share of completion tokens, the text
re-tokenized with the plain tokenizer, written before the span is closed: the same measure for
both runs), and for the expanded run the share of thinking tokens sampled as reasoning ids and
the reasoning rows' cosine to their originals. Saved as bench/results/reasoning_vocab.json and
a PNG (--out/reasoning_vocab.png). No gain is claimed: a few steps show whether the copies are
used and what they do to length and reward, not which run learns better.

Run:  .venv/bin/python bench/reasoning_vocab.py [--size 4096] [--steps 4] [max_tokens=...]
(trailing dotted overrides go to both trainers). About 10-15 minutes on two idle cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from statistics import fmean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import SERVER_FLAGS, save  # noqa: E402

from rlvr.data.arithmetic import arithmetic_splits, write_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "examples" / "reasoning_vocab_smollm2_cpu.yaml"
BASE_MODEL = "smollm2-135m"
CURVES = (
    "reward/mean",
    "rollouts/completion_len",
    "bench/think_share",
    "reasoning/reasoning_id_share",
    "reasoning/embedding_cosine",
    "mismatch_kl",
)
# Sampling speed, the gate and the folding tokenizer included (noisy on a shared machine)
SPEED = "throughput/gen_tokens_per_s"
KEYS = (*CURVES, SPEED)


def expanded_model(out: Path, size: int) -> Path:
    """The embedded model with `size` reasoning ids, written once under `out`."""
    from rlvr.config import ModelConfig
    from rlvr.reasoning_vocab.expand import expand_checkpoint
    from rlvr.reasoning_vocab.mapping import ReasoningVocab

    path = out / "models" / f"{BASE_MODEL}-rv{size}"
    vocab = ReasoningVocab.load(path)
    if vocab is None or (size != -1 and vocab.size != size):
        expand_checkpoint(ModelConfig(name=BASE_MODEL, reasoning_vocab_size=size), path)
    return path


def think_share(tokenizer: Any, completions: list[str], start: str, end: str) -> float:
    """Share of the completions' tokens written inside the think span the prompt opened."""
    from rlvr.reasoning_vocab.gate import ThinkTracker

    inside = total = 0
    for text in completions:
        text = text.removeprefix("assistant: ")  # the sample table's role label
        tracker = ThinkTracker(start, end, inside=True)
        for token in tokenizer.encode(text, add_special_tokens=False):
            inside += tracker.inside
            total += 1
            tracker.feed(tokenizer.decode([token]))
    return inside / max(total, 1)


def train(name: str, model: Path | str, size: int, out: Path, data: Path, args) -> list[dict]:
    """One GRPO run against its own vf-vllm; its metric records, with the thinking share."""
    from rlvr.config import load_config
    from rlvr.model.names import resolve_model
    from rlvr.reasoning_vocab.mapping import load_tokenizer
    from rlvr.server.process import VLLMServer
    from rlvr.trainer.grpo import Trainer

    run_dir = out / name
    print(f"{name}: serving {model}", flush=True)
    log = out / f"vf-vllm-{name}.log"
    with VLLMServer(str(model), extra_args=SERVER_FLAGS, log_path=log) as server:
        cfg = load_config(
            RECIPE,
            [
                f"model.name={model}",
                f"model.reasoning_vocab_size={size}",
                f"env.args.data_files={data}",
                f"server.base_url={server.base_url}",
                f"max_steps={args.steps}",
                f"seed={args.seed}",
                f"output_dir={run_dir}",
                "checkpoint.every=0",
                "wandb.mode=disabled",
                "logging.progress_bar=false",
                "logging.table_every=1",
                "logging.samples_per_step=100000",
                *args.overrides,
            ],
        )
        began = time.perf_counter()
        Trainer(cfg).run()
        print(f"{name}: {args.steps} steps in {time.perf_counter() - began:.0f} s", flush=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(resolve_model(BASE_MODEL))  # the plain one for both runs
    start, end = cfg.model.reasoning_start, cfg.model.reasoning_end
    for record in records:
        texts = [s["completion"] for s in samples if s["step"] == record["step"]]
        if texts and "reward/mean" in record:
            record["bench/think_share"] = think_share(tokenizer, texts, start, end)
    return [r for r in records if "reward/mean" in r]


def per_step(records: list[dict], key: str) -> list[float | None]:
    return [r.get(key) for r in records]


def summarise(runs: dict[str, list[dict]], args, out: Path) -> dict:
    from rlvr.eval.plots import plot_runs_compared

    png = plot_runs_compared(
        runs,
        out / "reasoning_vocab.png",
        CURVES,
        title=f"GRPO on arithmetic, SmolLM2-135M: baseline vs {args.size} reasoning ids",
    )
    print(f"figure: {png}")
    result: dict[str, Any] = {"figure": str(png)}
    for name, records in runs.items():
        result[name] = {key: per_step(records, key) for key in KEYS}
        result[name]["time_per_step_s"] = per_step(records, "time/step")
        logged = {key: [v for v in per_step(records, key) if v is not None] for key in KEYS}
        means = {key: fmean(values) for key, values in logged.items() if values}
        result[name]["mean_over_steps"] = means
        print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in means.items()))
    base, expanded = (result[n]["mean_over_steps"] for n in runs)
    result["ratios_expanded_over_baseline"] = {
        key: expanded[key] / base[key] for key in (*KEYS[:3], SPEED) if base.get(key)
    }
    print("expanded / baseline:", result["ratios_expanded_over_baseline"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "reasoning-vocab")
    parser.add_argument("--size", type=int, default=4096, help="reasoning ids (-1: all)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="dotted trainer overrides (both runs)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = args.out.resolve()
    train_rows, _ = arithmetic_splits(held_out=1, seed=args.seed)  # every problem but one
    data = write_jsonl(out / "data" / "train.jsonl", train_rows)
    runs = {
        "baseline": train("baseline", BASE_MODEL, 0, out, data, args),
        "expanded": train("expanded", expanded_model(out, args.size), 0, out, data, args),
    }
    payload = summarise(runs, args, out)
    save(
        "reasoning_vocab",
        {
            "recipe": str(RECIPE.relative_to(ROOT)),
            "size": args.size,
            "steps": args.steps,
            "seed": args.seed,
            "overrides": args.overrides,
            **payload,
        },
    )


if __name__ == "__main__":
    main()
