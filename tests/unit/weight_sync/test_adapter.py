"""LoRA adapter sync: the trainer pushes only the adapter, vf-vllm serves it on its frozen base
under its own name, and the base name keeps serving the base (vf_planner's frozen worker)."""

from __future__ import annotations

from rlvr.config import LoraConfig


def test_adapter_sync_problems_are_named():
    from rlvr.weight_sync.adapter import adapter_sync_problem

    assert adapter_sync_problem(_lora_model(["q_proj"]), 16) is None
    assert "lm_head" in adapter_sync_problem(_lora_model(["q_proj", "lm_head"]), 16)
    assert "--max-lora-rank 8" in adapter_sync_problem(_lora_model(["q_proj"], rank=16), 8)
    assert adapter_sync_problem(_lora_model(["q_proj"], rank=16), 16) is None
    assert "--enable-lora" in adapter_sync_problem(_lora_model(["q_proj"]), None)


def _lora_model(targets, rank: int = 4):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.model.policy import apply_lora

    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    return apply_lora(Qwen2ForCausalLM(config), LoraConfig(rank=rank, target_modules=targets))


def test_vf_vllm_enable_lora_defaults():
    from rlvr.server.launcher import engine_env, lora_defaults, lora_flags

    assert lora_defaults(["--enable-lora"]) == ["--max-lora-rank", "64", "--max-loras", "2"]
    assert lora_defaults(["--enable-lora", "--max-lora-rank", "8"]) == ["--max-loras", "2"]
    assert lora_defaults([]) == []
    assert lora_flags(16) == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2"]
    assert lora_flags(20)[2] == "32"  # the next rank vLLM accepts
    assert engine_env(False, "cpu", lora=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"


class _RecordingControl:
    """A stand-in for `ServerControl` that records which adapters are loaded and unloaded."""

    root = "http://127.0.0.1:8000"

    def __init__(self):
        self.loaded: list[str] = []
        self.unloaded: list[str] = []

    def resume(self) -> None:
        pass

    def get(self, path: str) -> dict:
        return {"data": []}  # no adapters left by an earlier trainer

    def worker_rpc(self, method: str, kwargs: dict | None = None) -> list:
        from rlvr.weight_sync.control import ServerError

        raise ServerError(f"no worker extension here ({method})")  # no exact check: the probe

    def post(self, path: str, json: dict) -> dict:
        names = self.loaded if path == "/v1/load_lora_adapter" else self.unloaded
        names.append(json["lora_name"])
        return {}

    def close(self) -> None:
        pass


def test_adapter_push_serves_each_version_and_releases_all_but_newest_and_requested(tmp_path):
    """Each version loads under its own name; a version never pushed is served by the newest
    before it; `release` keeps the newest and those still requested, and closing unloads the
    rest and deletes the files."""
    import pytest

    from rlvr.weight_sync.adapter import AdapterPush

    control = _RecordingControl()
    with AdapterPush(control, "http://127.0.0.1:8000/v1", "policy", root=tmp_path) as weights:
        weights.connect(_lora_model(["q_proj"]))
        for version in (0, 1, 2):
            assert weights.push(version) > 0
        assert control.loaded == ["policy-v0", "policy-v1", "policy-v2"]
        assert weights.served_name(1) == "policy-v1"
        assert weights.served_name(5) == "policy-v2"  # pushes skipped after version 2
        with pytest.raises(KeyError, match="pushed: 2"):
            weights.served_name(-1)
        weights.release(in_use=[0])
        assert control.unloaded == ["policy-v1"]
        assert sorted(p.name for p in weights.directory.iterdir()) == ["v000000", "v000002"]
    assert control.unloaded == ["policy-v1", "policy-v0", "policy-v2"]
    assert not weights.directory.exists()
