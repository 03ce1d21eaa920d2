"""Model naming, the tool-capable chat template, and the tiny test model (no server)."""

from pathlib import Path

import pytest

from rlvr.model.names import resolve_model


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_hub_ids_pass_through_untouched():
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == (
        "HuggingFaceTB/SmolLM2-135M-Instruct"
    )


def test_local_directory_resolves_to_absolute(tiny_model_dir: Path):
    assert resolve_model(str(tiny_model_dir)) == str(tiny_model_dir.resolve())


def test_tiny_model_shape_suits_vllm_cpu(tiny_model_dir: Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.head_dim >= 64  # vLLM's CPU attention needs head_dim >= 64
    assert config.model_type == "qwen2"


def _render(tokenizer, messages, tools=None):
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )


def test_template_renders_tools_calls_and_results_in_hermes_format(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "result one"},
        {"role": "tool", "tool_call_id": "c2", "content": "result two"},
    ]
    text = _render(tok, messages, tools)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    signatures = text.split("<tools>\n")[1].split("</tools>")[0]
    assert '"name": "lookup"' in signatures
    assert '<tool_call>\n{"name": "lookup", "arguments": {"q": 1}}\n</tool_call><|im_end|>' in text
    # consecutive tool results share one user turn
    assert text.count("<|im_start|>user") == 2
    assert "<tool_response>\nresult one\n</tool_response>\n<tool_response>\nresult two" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_template_without_tools_is_plain_chatml(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = _render(tok, [{"role": "user", "content": "2+2?"}])
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_previous_turn_is_a_token_prefix_of_the_next_prompt(tiny_model_dir: Path):
    """The trainer stitches turns into one sample when this holds (see rlvr.rollouts.to_samples)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = [{"role": "user", "content": "hello there"}]

    def ids(messages):
        return tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]

    prompt = ids(first)
    completion = tok.encode("some answer<|im_end|>", add_special_tokens=False)
    second = first + [
        {"role": "assistant", "content": "some answer"},
        {"role": "user", "content": "and then?"},
    ]
    assert ids(second)[: len(prompt) + len(completion)] == prompt + completion
