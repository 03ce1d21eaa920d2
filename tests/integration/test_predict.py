"""Predictions (rlvr.eval.predict, rlvr.server.serve_model, scripts/predict.py).

Unit tests cover reading prompt files and the vf-vllm flags an adapter directory needs; the
integration tests run the script against a real vf-vllm that serves the tiny model with a LoRA
adapter on top (vLLM's LoRA support on its CPU backend): the adapter's greedy answers are the
merged model's, and environment rows come back scored by the environment's rubric.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from unit.eval.test_predict import greedy_texts_agree, write_lines

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "predict.py"


def run_predict(*args: str | Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def served_answer(server, messages: list[dict], max_tokens: int) -> tuple[str, list[dict]]:
    """The adapter's greedy answer straight from the server, with each token's logprob entry
    (its id as "token_id:N", its bytes, and the best two logprobs at its position)."""
    body = {
        "model": server.adapter,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "logprobs": True,
        "top_logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return choice["message"]["content"], choice["logprobs"]["content"]


def answer_logprobs(model, prompt_ids: list[int], answer_ids: list[int]):
    """Each answer token's logprob under `model`, and the best logprob at its position."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + answer_ids])).logits[0].float()
    logprobs = logits[len(prompt_ids) - 1 : -1].log_softmax(-1)
    chosen = logprobs.gather(-1, torch.tensor(answer_ids)[:, None])[:, 0]
    return chosen, logprobs.max(-1).values


@pytest.mark.integration
def test_predict_with_an_adapter_answers_as_the_merged_model(tiny_lora_server, tmp_path: Path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = write_lines(
        tmp_path / "prompts.jsonl",
        json.dumps({"prompt": "Write a line about item 3.", "id": "a"}),
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 2+2?"},
                ],
                "id": "b",
            }
        ),
    )
    out = tmp_path / "answers.jsonl"
    proc = run_predict(
        "--model",
        tiny_lora_server.adapter,
        "--base-url",
        tiny_lora_server.base_url,
        "--prompts",
        prompts,
        "--out",
        out,
        "-T",
        "0",
        "-t",
        "8",
        "--batch-size",
        "2",
        "-S",
        json.dumps(tiny_lora_server.sampling_args),  # min_tokens: no empty answers
    )
    lines = read_jsonl(out)
    server_log = "\n".join(tiny_lora_server.log.read_text().splitlines()[-40:])
    errors = [line["error"] for line in lines]
    assert "2 rows, 0 errored; written to" in proc.stderr, f"{errors}\n{server_log}"
    assert [line["input"]["id"] for line in lines] == ["a", "b"]
    assert all("reward" not in line for line in lines)

    tokenizer = AutoTokenizer.from_pretrained(tiny_lora_server.model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_lora_server.model_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_lora_server.model_dir, dtype=torch.float32),
        str(tiny_lora_server.adapter_dir),
    ).merge_and_unload()
    for line in lines:
        text, entries = served_answer(tiny_lora_server, line["prompt"], 8)
        # predict asked for the adapter, greedily
        assert greedy_texts_agree(line["text"], text, entries), (line["text"], text, entries)
        answer_ids = [int(entry["token"].removeprefix("token_id:")) for entry in entries]
        served = [entry["logprob"] for entry in entries]
        prompt_ids = tokenizer.apply_chat_template(
            line["prompt"], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        chosen, best = answer_logprobs(merged, prompt_ids, answer_ids)
        # The random tiny model has near-ties, so "greedy" is checked up to float noise
        assert torch.allclose(chosen, best, atol=1e-4), (chosen, best)
        # vLLM normalises over its own vocabulary rows: a near-uniform random model shows it
        # as a constant offset of about 1e-3
        assert torch.allclose(chosen, torch.tensor(served), atol=5e-3), (chosen, served)
        base_chosen, _ = answer_logprobs(base, prompt_ids, answer_ids)
        assert (base_chosen - chosen).abs().max() > 2e-2  # the adapter was applied


@pytest.mark.integration
def test_predict_scores_environment_rows(tiny_lora_server, shared_data: Path, tmp_path: Path):
    data = shared_data / "deepscaler" / "preview_first803.jsonl"
    problems = read_jsonl(data)[:3]
    out = tmp_path / "predictions.jsonl"
    proc = run_predict(
        "--model",
        tiny_lora_server.model,
        "--base-url",
        tiny_lora_server.base_url,
        "--env",
        "vf-deepscaler",
        "--env-args",
        json.dumps({"data_files": str(data)}),
        "-n",
        "3",
        "--batch-size",
        "2",
        "-t",
        "16",
        "-S",
        json.dumps(tiny_lora_server.sampling_args),
        "--out",
        out,
    )
    lines = read_jsonl(out)
    assert [line["example_id"] for line in lines] == [0, 1, 2]
    for line, problem in zip(lines, problems, strict=True):
        assert line["prompt"][-1]["content"] == problem["problem"]
        assert line["answer"] == problem["answer"]
        # the rubric scored this very completion
        assert line["metrics"]["completion_chars"] == len(line["text"]) > 0
        if "\\boxed{" not in line["text"]:
            assert line["metrics"]["has_boxed"] == line["reward"] == 0.0
        assert line["reward"] == line["metrics"]["math_reward"]
    mean = sum(line["reward"] for line in lines) / 3
    assert f"3 rows, 0 errored, mean reward {mean:.4f}" in proc.stderr
