"""Predictions (rlvr.eval.predict, rlvr.server.serve_model, scripts/predict.py).

Unit tests cover reading prompt files and the vf-vllm flags an adapter directory needs; the
integration tests run the script against a real vf-vllm that serves the tiny model with a LoRA
adapter on top (vLLM's LoRA support on its CPU backend): the adapter's greedy answers are the
merged model's, and environment rows come back scored by the environment's rubric.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlvr.eval.predict import PredictError, final_text, output_row, read_prompts
from rlvr.model.tiny_model import build_tiny_adapter
from rlvr.server.serve_model import served_model
from rlvr.weight_sync.vllm_lora import lora_rank_limit, lora_serving_problem


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_predict_reads_prompt_files_and_names_bad_lines(tmp_path: Path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    good = write_lines(
        tmp_path / "p.jsonl",
        json.dumps({"prompt": "hello", "id": 7}),
        "",
        json.dumps({"messages": messages}),
    )
    prompts = read_prompts(good)
    assert prompts.rows == [
        {"prompt": [{"role": "user", "content": "hello"}], "example_id": 0},
        {"prompt": messages, "example_id": 1},
    ]
    assert prompts.lines[0] == {"prompt": "hello", "id": 7}
    for number, bad in enumerate(
        ["{not json", json.dumps({"text": "hi"}), json.dumps({"prompt": [{"role": "user"}]})]
    ):
        path = write_lines(tmp_path / f"bad{number}.jsonl", json.dumps({"prompt": "ok"}), bad)
        with pytest.raises(PredictError, match=rf"bad{number}.jsonl:2: "):
            read_prompts(path)
    with pytest.raises(PredictError, match="no prompts"):
        read_prompts(write_lines(tmp_path / "empty.jsonl", ""))


def test_predict_output_lines_carry_rewards_only_when_scored():
    completion = [
        {"role": "assistant", "content": "", "tool_calls": ['{"name": "search"}']},
        {"role": "tool", "content": "doc"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]
    output = {
        "example_id": 3,
        "prompt": [],
        "completion": completion,
        "reward": 1.0,
        "metrics": {"correct": 1.0},
        "answer": "4",
        "error": None,
        "is_truncated": False,
    }
    assert final_text(completion) == "\\boxed{4}" and final_text("plain") == "plain"
    scored = output_row(output, scored=True)
    assert (scored["text"], scored["reward"], scored["answer"]) == ("\\boxed{4}", 1.0, "4")
    assert "reward" not in output_row(output, scored=False)


def test_predict_serves_an_adapter_on_its_base_with_lora(tmp_path: Path):
    adapter = tmp_path / "run" / "final"
    adapter.mkdir(parents=True)
    config = {"base_model_name_or_path": "/models/base", "r": 12, "rank_pattern": {}}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    served = served_model(str(adapter))
    assert (served.model, served.name) == ("/models/base", str(adapter))
    assert served.server_args == (
        "--enable-lora",
        "--lora-modules",
        f"{adapter}={adapter.resolve()}",
        "--max-lora-rank",
        "16",
    )
    config["rank_pattern"] = {"q_proj": 40}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    assert served_model(str(adapter), name="tuned").server_args[-1] == "64"
    assert served_model("smollm2-135m").server_args == ("--served-model-name", "smollm2-135m")
    assert [lora_rank_limit(r) for r in (1, 2, 8, 9, 300)] == [1, 8, 8, 16, 320]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        lora_rank_limit(1024)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    with pytest.raises(ValueError, match="names no base_model_name_or_path"):
        served_model(str(adapter))


def test_predict_merges_an_adapter_vllm_cannot_apply(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch
):
    """vLLM's LoRA does not cover lm_head or the embeddings: such an adapter is served as its
    merged copy, made once in RLVR_CACHE."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert lora_serving_problem({"target_modules": ["q_proj", "v_proj"]}) is None
    assert "lm_head" in lora_serving_problem({"target_modules": ["q_proj", "lm_head"]})
    modules_to_save = {"target_modules": ["q_proj"], "modules_to_save": ["embed_tokens"]}
    assert "modules_to_save" in lora_serving_problem(modules_to_save)
    assert "lm_head" in lora_serving_problem({"target_modules": ".*(q_proj|lm_head)"})
    assert "--max-lora-rank 8" in lora_serving_problem({"r": 16, "target_modules": ["q_proj"]}, 8)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    adapter = build_tiny_adapter(tiny_model_dir, tmp_path / "final", targets=("q_proj", "lm_head"))
    served = served_model(str(adapter), name="trained")
    assert served.server_args == ("--served-model-name", "trained")
    merged = Path(served.model)
    assert merged.parent == tmp_path / "cache" / "merged"
    ids = torch.tensor([[1, 5, 9, 3]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, str(adapter))
    with torch.no_grad():
        expected = peft(input_ids=ids).logits
        got = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    weights = merged / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert served_model(str(adapter)).model == str(merged) and weights.stat().st_mtime_ns == stamp


def greedy_texts_agree(text: str, served: str, entries: list[dict], tie: float = 1e-4) -> bool:
    """Equal, or equal up to the token where the served answer's best two logprobs were within
    `tie`: predict batches its requests, and another batch shape rounds differently, which can
    flip a near-tie of the random tiny model (and everything after it)."""
    if text == served:
        return True
    ours, theirs = text.encode(), served.encode()
    common = len(os.path.commonprefix([ours, theirs]))
    end = 0
    for entry in entries:
        end += len(entry["bytes"] or b"")
        if end > common:
            best, second = (top["logprob"] for top in entry["top_logprobs"][:2])
            return best - second < tie
    return False


def test_greedy_texts_agree_only_up_to_a_near_tie():
    def entry(piece: str, best: float, second: float) -> dict:
        tops = [{"logprob": best}, {"logprob": second}]
        return {"bytes": list(piece.encode()), "top_logprobs": tops}

    entries = [entry("ab", -1.0, -2.0), entry("cé", -1.0, -1.00001), entry("d", -1.0, -3.0)]
    assert greedy_texts_agree("abcéd", "abcéd", entries)
    assert greedy_texts_agree("abxyz", "abcéd", entries)  # diverged at the tied token
    assert not greedy_texts_agree("axcéd", "abcéd", entries)  # ... not at a clear one
    assert not greedy_texts_agree("abcéx", "abcéd", entries)
    assert not greedy_texts_agree("abcédz", "abcéd", entries)  # longer than what was served
