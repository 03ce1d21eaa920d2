"""SFT (rlvr.trainer.sft, rlvr.data.sft_rows, scripts/sft.py) on the CPU with the tiny model and
real GSM8K rows: the assistant-only loss mask, loss normalisation that ignores how a step is split,
learning, exact resume, the saved outputs, and clear errors for bad input.

Numbers (tiny model, LoRA rank 16 on every projection + lm_head, lr 1e-2, 48 GSM8K rows cut to
256 tokens, 8 per step, measured on the 2-core dev machine): the training loss falls from 6.09
(mean of steps 1-3; uniform over the 467-token vocabulary is 6.15) to 4.15 (steps 18-20), and
the loss on 8 held-out rows from 6.18 to 4.27. The whole file takes ~35 s there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import masked_runs
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.config import ConfigError, SFTConfig, SFTDataConfig, load_config
from rlvr.data.sft_rows import (
    DataError,
    assistant_mask,
    read_conversations,
    to_messages,
    to_tools,
    tokenize,
)
from rlvr.layout.micro_batches import collate, rank_micro_batches
from rlvr.trainer.checkpoint import list_checkpoints
from rlvr.trainer.loss import normalised_loss
from rlvr.trainer.sft import SFTTrainer, nll_sum

ROOT = Path(__file__).resolve().parents[3]
LORA_TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"


def gsm8k(shared_data: Path) -> str:
    return str(shared_data / "gsm8k" / "test.jsonl")


def sft_config(model_dir, train_file, out, *extra) -> SFTConfig:
    """GSM8K question -> prompt, answer -> completion, on the tiny model."""
    return load_config(
        overrides=[
            f"model.name={model_dir}",
            f"data.train_files=[{train_file}]",
            "data.format=prompt_completion",
            "data.prompt_column=question",
            "data.completion_column=answer",
            "data.max_seq_len=256",
            "train.batch_size=8",
            "train.micro_batch_size=4",
            "optim.lr=1e-2",
            "optim.warmup_steps=0",
            f"lora.target_modules={LORA_TARGETS}",
            "checkpoint.every=0",
            "wandb.mode=disabled",
            f"output_dir={out}",
            *extra,
        ],
        cls=SFTConfig,
    )


# ---- the loss mask ---------------------------------------------------------------------------


def test_mask_is_exactly_the_assistant_turns_and_their_end_token(tiny_model_dir):
    """Loss goes on each assistant turn's content (tool calls included) and its `<|im_end|>`,
    the token that ends the turn at inference. Nothing of the system, user or tool messages,
    the `<|im_start|>assistant` header, or the newline the template puts after `<|im_end|>`."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    call = {"id": "c1", "name": "calc", "arguments": '{"expr": "5*4"}'}
    row = {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+3?"},
            {"role": "assistant", "content": "5"},
            {"role": "user", "content": "And times 4?"},
            {"role": "assistant", "content": None, "tool_calls": [json.dumps(call)]},
            {"role": "tool", "content": "20", "tool_call_id": "c1"},
            {"role": "assistant", "content": "It is 20."},
        ]
    }
    messages = to_messages(row, SFTDataConfig(), "row 1 of test")
    ids, mask = assistant_mask(tokenizer, messages, "row 1 of test")
    runs = [tokenizer.decode(run) for run in masked_runs(ids, mask)]
    assert runs == [
        "5<|im_end|>",
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "5*4"}}\n</tool_call><|im_end|>',
        "It is 20.<|im_end|>",
    ]
    unmasked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    for text in ("You are terse.", "What is 2+3?", "And times 4?", "<tool_response>\n20"):
        assert text in unmasked


def test_tool_definitions_are_rendered_as_at_inference_and_get_no_loss(tiny_model_dir, tmp_path):
    """Exported rollouts carry verifiers' tool definitions; the template shows them to the
    model (in the system block, which gets no loss), exactly as an OpenAI-form definition."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    schema = {"name": "calc", "description": "Evaluate.", "parameters": {"type": "object"}}
    messages = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}]
    saved = to_tools([json.dumps(schema)], "row 1")
    assert saved == to_tools([{"type": "function", "function": schema}], "row 1")
    ids, mask = assistant_mask(tokenizer, messages, "row 1", saved)
    assert [tokenizer.decode(run) for run in masked_runs(ids, mask)] == ["5<|im_end|>"]
    unmasked = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "<tools>" in unmasked and '"name": "calc"' in unmasked
    plain_ids, _ = assistant_mask(tokenizer, messages, "row 1")
    assert len(plain_ids) < len(ids)
    assert to_tools(None, "row 1") is None and to_tools([], "row 1") is None
    for bad in ("calc", ["{not json"], [{"description": "no name"}]):
        with pytest.raises(DataError, match="row 7"):
            to_tools(bad, "row 7")

    data = tmp_path / "exported.jsonl"  # what `eval_report.py --export-sft` writes
    rows = [{"messages": messages, "tools": [schema]}, {"messages": messages}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    read = read_conversations([str(data)], SFTDataConfig())
    assert [c.tools for c in read] == [saved, None]


def test_prompt_completion_rows_and_the_system_prompt(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = SFTDataConfig(format="prompt_completion", system_prompt="Be brief.")
    messages = to_messages({"prompt": "2+2?", "completion": "4"}, cfg, "row 1")
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    listed = {
        "prompt": [{"role": "system", "content": "Own."}, {"role": "user", "content": "x"}],
        "completion": [{"role": "assistant", "content": "y"}],
    }
    assert to_messages(listed, cfg, "row 2")[0]["content"] == "Own."  # not replaced
    ids, mask = assistant_mask(tokenizer, messages, "row 1")
    assert [tokenizer.decode(r) for r in masked_runs(ids, mask)] == ["4<|im_end|>"]


def test_long_examples_are_truncated_or_dropped_and_counted(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    from rlvr.data.sft_rows import Conversation

    def conversation(prompt_words: int, answer_words: int) -> Conversation:
        messages = [
            {"role": "user", "content": "what " * prompt_words},
            {"role": "assistant", "content": "the " * answer_words},
        ]
        return Conversation(messages, f"row {prompt_words}")

    rows = [conversation(2, 2), conversation(2, 60), conversation(60, 2)]
    kept, stats = tokenize(rows, tokenizer, SFTDataConfig(max_seq_len=40))
    assert (stats.examples, stats.truncated, stats.dropped) == (2, 1, 1)
    assert stats.dropped_rows == ["row 60"]  # its answer starts beyond 40 tokens
    assert [len(e.sample) <= 40 for e in kept] == [True, True]
    assert [e.truncated for e in kept] == [False, True]
    kept, stats = tokenize(rows, tokenizer, SFTDataConfig(max_seq_len=40, truncation="drop"))
    assert (stats.examples, stats.truncated, stats.dropped) == (1, 0, 2)


# ---- the loss ------------------------------------------------------------------------------


@pytest.mark.slow
def test_loss_normalisation_ignores_the_micro_batch_and_rank_split(tiny_model_dir, shared_data):
    """The gradient of one step is the same for 1 micro-batch, 8 micro-batches of one
    sequence, and 2 ranks x 3 micro-batches (DDP averages the ranks' gradients)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = SFTDataConfig(
        format="prompt_completion",
        prompt_column="question",
        completion_column="answer",
        max_seq_len=256,
    )
    from rlvr.data.sft_rows import read_conversations

    examples, _ = tokenize(read_conversations([gsm8k(shared_data)], cfg)[:8], tokenizer, cfg)
    samples = [e.sample for e in examples]
    global_tokens = sum(s.num_loss_tokens for s in samples)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    pad = tokenizer.pad_token_id

    def step_gradient(world: int, micro: int) -> tuple[float, torch.Tensor]:
        ranks = []
        for rank in range(world):
            model.zero_grad()
            for chunk in rank_micro_batches(samples, rank, world, micro, pad):
                normalised_loss(
                    nll_sum(model, collate(chunk, pad)), global_tokens, world
                ).backward()
            ranks.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        with torch.no_grad():
            total = sum(nll_sum(model, collate([[s]], pad)).item() for s in samples)
        return total / global_tokens, torch.stack(ranks).mean(0)

    loss, reference = step_gradient(1, 8)
    assert 5.5 < loss < 7  # random weights: about log(vocabulary)
    for world, micro in [(1, 1), (2, 3)]:
        _, grad = step_gradient(world, micro)
        assert torch.allclose(grad, reference, rtol=1e-4, atol=1e-7), (world, micro)


@pytest.mark.slow
def test_trainer_steps_do_not_depend_on_micro_batch_size(tiny_model_dir, shared_data, tmp_path):
    """Full fine-tuning, two steps with micro-batches of 1 and of 8: same losses, gradient
    norms and weights. The final full model loads as a plain Hugging Face model."""
    runs = {}
    for micro in (1, 8):
        cfg = sft_config(
            tiny_model_dir,
            gsm8k(shared_data),
            tmp_path / f"m{micro}",
            "lora.enabled=false",
            "optim.lr=1e-3",
            "data.max_examples=16",
            "train.max_steps=2",
            f"train.micro_batch_size={micro}",
        )
        runs[micro] = SFTTrainer(cfg).run()
    for a, b in zip(runs[1], runs[8], strict=True):
        for key in ("train/loss", "train/grad_norm", "train/loss_tokens"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    final = [load_file(tmp_path / f"m{m}" / "final" / "model.safetensors") for m in (1, 8)]
    # Adam's first steps move each weight by ~lr whatever the gradient's size, so float
    # rounding in near-zero gradients shows at ~1e-5; a real difference would show at ~lr
    assert max((final[0][k] - final[1][k]).abs().max().item() for k in final[0]) < 1e-4
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m1" / "final")
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(tmp_path / "m1" / "final"))


@pytest.mark.slow
def test_two_ranks_take_the_same_steps_as_one(tiny_model_dir, shared_data, tmp_path):
    """scripts/sft.py under torchrun with 2 CPU processes (DDP): each rank trains its half of
    every step, and the losses and gradient norms equal a single process's."""
    from rlvr.config import save_config

    extra = ["data.max_examples=16", "train.max_steps=2", "train.micro_batch_size=3"]
    ddp = sft_config(tiny_model_dir, gsm8k(shared_data), tmp_path / "ddp", *extra)
    save_config(ddp, tmp_path / "ddp.yaml")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*torchrun, str(ROOT / "scripts" / "sft.py"), "--config", str(tmp_path / "ddp.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={**os.environ, "ACCELERATE_USE_CPU": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logged = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    two = [m for m in logged if "train/loss" in m]
    one = SFTTrainer(sft_config(tiny_model_dir, gsm8k(shared_data), tmp_path / "one", *extra))
    for a, b in zip(one.run(), two, strict=True):
        for key in ("train/loss", "train/grad_norm", "train/loss_tokens"):
            assert b[key] == pytest.approx(a[key], rel=1e-4), key


# ---- learning, outputs, resume ----------------------------------------------------------------


@pytest.mark.slow
def test_sft_learns_gsm8k_and_leaves_a_complete_run(tiny_model_dir, shared_data, tmp_path):
    out = tmp_path / "run"
    cfg = sft_config(
        tiny_model_dir,
        gsm8k(shared_data),
        out,
        "data.max_examples=48",
        "data.validation_holdout=8",
        "train.max_steps=20",
        "train.eval_every=10",
        "train.micro_batch_size=8",
        "checkpoint.every=8",
        "checkpoint.keep_last=2",
        "wandb.mode=offline",
    )
    history = SFTTrainer(cfg).run()

    losses = [h["train/loss"] for h in history]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    print(f"train loss per step: {[round(x, 3) for x in losses]}")
    assert first > 5.5, losses  # random weights: about log(vocabulary)
    assert last < first - 1.0, f"loss did not fall: first {first:.3f}, last {last:.3f}"

    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in logged if "train/loss" in m]
    assert [m["step"] for m in steps] == list(range(1, 21))
    for key in ("train/learning_rate", "train/tokens_per_s", "train/epoch", "train/truncated"):
        assert key in steps[-1], key
    data = next(m for m in logged if "data/train_rows" in m)
    assert data["data/train_rows"] == 48 and data["data/val_rows"] == 8  # held out of the file
    # the tiny tokenizer spends ~1 token per character: GSM8K rows run past 256 tokens
    assert data["data/train_truncated"] > 0 and data["data/train_dropped"] > 0
    assert steps[-1]["train/epoch"] == pytest.approx(20 * 8 / data["data/train_examples"])
    val = [(m["step"], m["val/loss"]) for m in logged if "val/loss" in m]
    print(f"validation loss (step, loss): {val}")
    assert [s for s, _ in val] == [0, 10, 20]
    assert val[-1][1] < val[0][1] - 0.5, val

    saved = load_config(out / "config.yaml", cls=SFTConfig)
    assert saved.data.max_examples == 48 and saved.lora.enabled
    assert [p.name for p in list_checkpoints(out)] == ["step_000016", "step_000020"]
    assert list((out / "wandb").glob("offline-run-*")), "W&B runs offline without a key"
    from rlvr.model.merge import merge_adapter

    merged = merge_adapter(out / "final", tmp_path / "merged")
    assert AutoModelForCausalLM.from_pretrained(merged).config.model_type == "qwen2"
    # a new run that starts from the trained adapter starts from its loss, not from scratch
    again = sft_config(
        tiny_model_dir,
        gsm8k(shared_data),
        tmp_path / "again",
        "data.max_examples=48",
        "train.max_steps=1",
        f"lora.resume_from={out / 'final'}",
    )
    assert SFTTrainer(again).run()[0]["train/loss"] < first - 1.0


def test_resume_continues_exactly(tiny_model_dir, shared_data, tmp_path):
    """Stopped after 2 steps and resumed: the remaining steps (crossing into the second,
    reshuffled epoch, with LoRA dropout drawing on the restored RNG and a cosine schedule)
    equal those of an uninterrupted run."""
    extra = [
        "data.max_examples=12",
        "train.batch_size=4",
        "train.micro_batch_size=2",
        "train.max_steps=5",
        "lora.dropout=0.1",
        "optim.scheduler=cosine",
        "optim.warmup_steps=1",
    ]
    straight = SFTTrainer(sft_config(tiny_model_dir, gsm8k(shared_data), tmp_path / "a", *extra))
    straight = straight.run()
    cut = SFTTrainer(sft_config(tiny_model_dir, gsm8k(shared_data), tmp_path / "b", *extra))
    assert len(cut.run(stop_after=2)) == 2
    assert [p.name for p in list_checkpoints(tmp_path / "b")] == ["step_000002"]
    resumed = SFTTrainer(
        sft_config(
            tiny_model_dir, gsm8k(shared_data), tmp_path / "b", *extra, "checkpoint.resume=auto"
        )
    ).run()
    assert len(resumed) == 3
    for a, b in zip(straight[2:], resumed, strict=True):
        for key in ("train/loss", "train/grad_norm", "train/learning_rate", "train/epoch"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-8), key
    wa = load_file(tmp_path / "a" / "final" / "adapter_model.safetensors")
    wb = load_file(tmp_path / "b" / "final" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys()
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5


# ---- bad input ---------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_missing_data_file_fails_before_the_model_loads(tmp_path):
    cfg = sft_config("/nonexistent/model", tmp_path / "nope.jsonl", tmp_path / "run")
    with pytest.raises(DataError, match=r"data file .*nope\.jsonl does not exist"):
        SFTTrainer(cfg).run()


def test_bad_rows_name_the_row(tmp_path):
    cfg = SFTDataConfig(format="prompt_completion")
    from rlvr.data.sft_rows import read_conversations

    gap = write_jsonl(
        tmp_path / "gap.jsonl",
        [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": None}],
    )
    with pytest.raises(
        DataError, match=r"row 2 of .*gap\.jsonl has no value in column 'completion'"
    ):
        read_conversations([gap], cfg)
    other = write_jsonl(tmp_path / "other.jsonl", [{"question": "a", "answer": "b"}])
    with pytest.raises(DataError, match=r"row 1 of .*other\.jsonl has no column 'prompt'"):
        read_conversations([other], cfg)
    chats = write_jsonl(
        tmp_path / "chats.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            },
            {"messages": [{"role": "user", "content": "hi"}]},
        ],
    )
    with pytest.raises(DataError, match=r"row 2 of .*chats\.jsonl: .* no assistant turn"):
        read_conversations([chats], SFTDataConfig())
    with pytest.raises(DataError, match="use .jsonl, .json or .parquet"):
        read_conversations([write_jsonl(tmp_path / "rows.csv", [])], cfg)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epoch=2", "unknown config key train.epoch"),
        ("data.prompt_col=q", "unknown config key data.prompt_col"),
        ("batch.batch_size=8", "unknown config key batch"),
        ("data.truncation=cut", "data.truncation='cut': choose one of"),
        ("data.train_files=[]", "data.train_files=[]: name at least one file"),
    ],
)
def test_bad_config_names_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(overrides=["data.train_files=[x.jsonl]", override], cls=SFTConfig)


def test_sft_defaults_survive_a_partial_section():
    """SFT's own defaults (cosine schedule with warm-up, lr 1e-4, W&B project rlvr-sft) stay
    when a file or override sets only some keys of a section."""
    cfg = load_config(
        overrides=["data.train_files=[x.jsonl]", "optim.lr=3e-4", "wandb.mode=disabled"],
        cls=SFTConfig,
    )
    assert (cfg.optim.lr, cfg.optim.scheduler, cfg.optim.warmup_steps) == (3e-4, "cosine", 10)
    assert (cfg.wandb.mode, cfg.wandb.project) == ("disabled", "rlvr-sft")
    assert load_config(cls=SFTConfig, overrides=["data.train_files=[x]"]).optim.lr == 1e-4


@pytest.mark.slow
def test_script_runs_from_the_command_line_and_reports_bad_input(tiny_model_dir, tmp_path):
    """`python scripts/sft.py --config ... key=value`: a two-step run of the example config on
    the tiny model, and the launcher's one-line errors."""
    rows = [{"prompt": f"What is {i}+{i}?", "completion": f"{2 * i}"} for i in range(8)]
    data = write_jsonl(tmp_path / "sums.jsonl", rows)
    script = [sys.executable, str(ROOT / "scripts" / "sft.py")]
    example = ["--config", str(ROOT / "configs" / "examples" / "sft_smollm2_cpu.yaml")]
    args = [
        f"--model={tiny_model_dir}",
        f"data.train_files=[{data}]",
        "data.prompt_column=prompt",
        "data.completion_column=completion",
        "data.validation_holdout=2",
        "train.max_steps=2",
        "wandb.mode=disabled",
        f"--output-dir={tmp_path / 'run'}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [*script, *example, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "step 2/2 | epoch" in done.stdout and "# rlvr SFT config" in done.stdout
    assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()
    bad = subprocess.run(
        [*script, *example, "train.epoch=2"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert bad.returncode == 1 and "unknown config key train.epoch" in bad.stderr
