"""Publishing (rlvr.eval.publish, rlvr.eval.model_card, scripts/merge_adapter.py --push-to-hub).

No machine here reaches the Hub, so the push itself is not exercised; what is: the card and
files a push would upload (--dry-run writes them), and that without a token or network the
script stops with the reason before merging anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlvr.config import load_config, save_config
from rlvr.eval.model_card import RunRecord, demote_headings, hub_id, model_card, read_run
from rlvr.eval.plots import plot_estimate_bars
from rlvr.eval.stats import Estimate
from rlvr.model.tiny_model import build_tiny_adapter

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "merge_adapter.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REWARDS = [0.1, 0.2, 0.3, 0.5, 0.6, 0.7]


@pytest.fixture
def grpo_run(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A run directory as `scripts/train.py` leaves it: config.yaml, metrics.jsonl (6 steps),
    a checkpoint at step 4 and the final adapter."""
    run = tmp_path / "run"
    build_tiny_adapter(tiny_model_dir, run / "final")
    config = load_config(
        overrides=[
            f"model.name={tiny_model_dir}",
            "env.id=vf-deepscaler",
            "env.args={data_files: deepscaler.jsonl}",
            "lora.rank=8",
            "max_steps=6",
            f"output_dir={run}",
        ]
    )
    save_config(config, run / "config.yaml")
    records = [
        {
            "step": s,
            "reward/mean": r,
            "reward/std": 0.1,
            "loss/kl_ref": 0.0,
            "mismatch_kl": 1e-9 * s,
            "time/step": 2.0 + s / 10,
        }
        for s, r in enumerate(REWARDS, start=1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    checkpoint = run / "checkpoints" / "step_000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 4}))
    return run


@pytest.fixture
def eval_report(tmp_path: Path) -> Path:
    folder = tmp_path / "sweep"
    plot_estimate_bars(["default"], {"base": [Estimate(0.2, 0.1, 0.3, 8)]}, folder / "plots/r.png")
    report = folder / "report.md"
    report.write_text(
        "# Evaluation sweep: vf-deepscaler\n\n## mean reward [95% CI]\n\n| model | x |\n"
        "| --- | --- |\n| base | 0.200 [0.100, 0.300] |\n\n![Mean reward](plots/r.png)\n"
        "![remote](https://example.com/x.png)\n"
    )
    return report


def merge(*args: str | Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def card_parts(card: str) -> tuple[dict, str]:
    _, metadata, body = card.split("---\n", 2)
    return yaml.safe_load(metadata), body


@pytest.mark.slow
def test_publish_dry_run_writes_the_card_and_files_it_would_push(
    grpo_run: Path, eval_report: Path, tiny_model_dir: Path, tmp_path: Path
):
    out = tmp_path / "merged"
    # a dry run touches no network: an unreachable endpoint and no token do not matter
    no_hub = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": ""}
    proc = merge(
        grpo_run / "final",
        out,
        "--push-to-hub",
        "me/tiny-grpo",
        "--private",
        "--eval-report",
        eval_report,
        "--dry-run",
        env=no_hub,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dry run: would push" in proc.stdout and "to me/tiny-grpo (private)" in proc.stdout
    for name in (
        "README.md",
        "training_curves.png",
        "plots/r.png",
        "config.json",
        "tokenizer.json",
    ):
        assert f"  {name}  " in proc.stdout
    assert (out / "training_curves.png").read_bytes().startswith(PNG_MAGIC)
    assert (out / "plots" / "r.png").read_bytes() == (
        eval_report.parent / "plots/r.png"
    ).read_bytes()

    metadata, body = card_parts((out / "README.md").read_text())
    assert metadata["tags"] == ["rlvr", "grpo", "verifiers", "vf-deepscaler", "lora"]
    assert "base_model" not in metadata  # a local directory is no Hub id
    assert body.startswith("\n# tiny-grpo\n")
    assert f"GRPO fine-tune of `{tiny_model_dir}`, trained with rlvr for 6 optimizer steps" in body
    assert "on the verifiers environment `vf-deepscaler`" in body
    assert "LoRA adapter (rank 8, alpha 16, on q_proj, v_proj) and merged" in body  # as merged
    assert "| rollouts per step | 64 (groups of 8) |" in body
    assert (
        '| environment | `vf-deepscaler` with args `{"data_files": "deepscaler.jsonl"}` |' in body
    )
    assert "| optimizer steps | 6 |" in body  # metrics go past the last checkpoint (4)
    assert "| training reward, start → end | 0.2000 (steps 1–3) → 0.6000 (steps 4–6) |" in body
    assert "![Training curves](training_curves.png)" in body
    # the eval report sits under "## Evaluation", its headings demoted, its image copied
    evaluation = body.split("## Evaluation\n", 1)[1]
    assert evaluation.startswith("\n### Evaluation sweep: vf-deepscaler\n\n#### mean reward")
    assert "| base | 0.200 [0.100, 0.300] |" in evaluation
    assert "![Mean reward](plots/r.png)" in evaluation
    assert "vf-vllm --model me/tiny-grpo" in body
    config = yaml.safe_load(body.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert config["env"]["id"] == "vf-deepscaler" and config["max_steps"] == 6


@pytest.mark.slow
def test_publish_without_network_or_token_fails_before_merging(grpo_run: Path, tmp_path: Path):
    out = tmp_path / "merged"
    offline = merge(
        grpo_run / "final",
        out,
        "--push-to-hub",
        "me/tiny-grpo",
        env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_test"},
    )
    assert offline.returncode == 1
    assert offline.stderr.startswith("error: cannot reach the Hugging Face Hub at ")
    assert "http://127.0.0.1:9" in offline.stderr and "--dry-run" in offline.stderr
    no_token = merge(
        grpo_run / "final",
        out,
        "--push-to-hub",
        "me/tiny-grpo",
        env={"HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf")},
    )
    assert no_token.returncode == 1 and "error: no Hugging Face token" in no_token.stderr
    bad_repo = merge(grpo_run / "final", out, "--push-to-hub", "me/a/b", "--dry-run")
    assert bad_repo.returncode == 1 and "--push-to-hub 'me/a/b'" in bad_repo.stderr
    assert "merged model written" not in offline.stdout + no_token.stdout + bad_repo.stdout
    assert not out.exists()
    misuse = merge(grpo_run / "final", out, "--dry-run")
    assert misuse.returncode == 2 and "--dry-run goes with --push-to-hub" in misuse.stderr


def test_publish_card_names_the_embedded_base_and_sft_runs():
    sft = RunRecord(
        None,
        config={"model": {"name": "smollm2-135m"}, "data": {"train_files": ["chats.jsonl"]}},
        metrics=[{"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.0}],
        steps=2,
    )
    metadata, body = card_parts(model_card(sft, "tuned"))
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert metadata["tags"] == ["rlvr", "sft", "verifiers"]
    assert "SFT fine-tune of `smollm2-135m` (the Q4_1 GGUF" in body
    assert "| training data | `chats.jsonl` |" in body
    assert "| training loss, start → end | 2.0000 (step 1) → 1.0000 (step 2) |" in body
    assert "No evaluation report was published" in body and "LoRA adapter" not in body
    assert [hub_id(n) for n in ("Qwen/Qwen2.5-0.5B", "/abs/dir", "a/b/c", None)] == [
        "Qwen/Qwen2.5-0.5B",
        None,
        None,
        None,
    ]


def test_publish_reads_an_adapter_without_a_run_directory(tiny_model_dir: Path, tmp_path: Path):
    adapter = build_tiny_adapter(tiny_model_dir, tmp_path / "adapter")
    run = read_run(adapter)
    assert (run.run_dir, run.steps, run.method) == (None, None, None)
    assert run.base_model == str(tiny_model_dir)
    _, body = card_parts(model_card(run, "x/y"))
    assert "| optimizer steps | unknown |" in body and "## Training configuration" not in body


def test_publish_demotes_headings_outside_code_fences():
    text = "# Title\ntext #1\n```bash\n# a comment\n```\n## Sub"
    assert demote_headings(text, 2) == "### Title\ntext #1\n```bash\n# a comment\n```\n#### Sub"
