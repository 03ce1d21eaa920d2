"""The trainer on a GPU: DeepSpeed ZeRO-3 (one process, bf16) with vf-vllm on the same GPU,
weights moved by CUDA IPC after every step, and the merged-LoRA stream gathered under ZeRO-3.

Marked `gpu`: skipped without CUDA or DeepSpeed; the test that starts vf-vllm also needs
vLLM's CUDA build (the lent GPU machines have none), the stream test does not.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support import measured

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed"),
]
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs vLLM (CUDA build) to serve"
)

TRAIN = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {tests!r})
    from toy_env import target_share_env
    from transformers import AutoTokenizer
    from rlvr.config import load_config
    from rlvr.trainer.grpo import Trainer

    cfg = load_config(overrides={overrides!r})
    target = AutoTokenizer.from_pretrained({model!r}).convert_tokens_to_ids("42")
    history = Trainer(cfg, env=target_share_env(target)).run()
    with open({out!r}, "w") as f:
        json.dump(history, f)
    """
)


def zero3_launch(script: Path) -> list[str]:
    """`accelerate launch` of `script` with configs/zero3.yaml on one process."""
    config = ROOT / "configs" / "zero3.yaml"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config-file", str(config)]
    return [*launch, "--num-processes", "1", str(script)]


@needs_vllm
def test_zero3_one_process_with_vf_vllm_on_the_same_gpu_via_ipc(tiny_model_dir, tmp_path):
    from rlvr.server.process import VLLMServer

    flags = [
        "--dtype",
        "bfloat16",
        "--gpu-memory-utilization",
        "0.3",
        "--enforce-eager",
        "--weight-transfer-backend",
        "ipc",
    ]
    with VLLMServer(str(tiny_model_dir), extra_args=flags, log_path=tmp_path / "vllm.log") as srv:
        history_file = tmp_path / "history.json"
        overrides = [
            f"model.name={tiny_model_dir}",
            f"server.base_url={srv.base_url}",
            f"server.served_model={srv.model}",
            "server.backend=ipc",
            "model.dtype=bfloat16",
            "model.gradient_checkpointing=true",
            "batch.batch_size=16",
            "batch.rollouts_per_example=4",
            "batch.micro_batch_size=4",
            "sampling.max_tokens=16",
            "max_steps=3",
            "optim.lr=1e-2",
            "wandb.mode=disabled",
            "logging.progress_bar=false",
            f"output_dir={tmp_path / 'run'}",
        ]
        script = tmp_path / "train.py"
        script.write_text(
            TRAIN.format(
                tests=str(ROOT / "tests"),
                overrides=overrides,
                model=str(tiny_model_dir),
                out=str(history_file),
            )
        )
        result = subprocess.run(
            zero3_launch(script), capture_output=True, text=True, timeout=900, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr[-4000:] + srv.log_tail()
    history = json.loads(history_file.read_text())
    assert len(history) == 3
    assert all(h["time/weight_push"] > 0 for h in history)
    # bf16 on both sides: not float32's 1e-13, but far below what stale weights give
    assert max(measured(history, "mismatch_kl")) < 5e-2
    assert (tmp_path / "run" / "final" / "adapter_config.json").is_file()


def test_merged_stream_under_zero3_matches_the_unpartitioned_merge(tmp_path):
    """ZeRO-3 partitions every parameter; the stream must gather each module and merge it."""
    script = tmp_path / "zero3_stream.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from accelerate import Accelerator
            from transformers import Qwen2Config, Qwen2ForCausalLM
            from rlvr.config import LoraConfig
            from rlvr.weight_sync.merged_stream import MergedWeightSource
            from rlvr.model.policy import apply_lora

            acc = Accelerator()
            ds = acc.state.deepspeed_plugin.deepspeed_config
            ds["train_micro_batch_size_per_gpu"] = 1
            config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=2, head_dim=32)

            def seeded_lora_model():
                # the same weights every call; lora_B non-zero so merging changes the base
                torch.manual_seed(0)
                model = apply_lora(Qwen2ForCausalLM(config), LoraConfig(rank=4))
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        if "lora_B" in n:
                            p.normal_(std=0.1)
                return model

            reference = {n: p.detach().float().cpu().clone()
                         for n, p in seeded_lora_model().merge_and_unload().named_parameters()}
            model = seeded_lora_model()
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
            engine, opt = acc.prepare(model, opt)
            source = MergedWeightSource(acc.unwrap_model(engine))
            assert all(m.shape == reference[m.name].shape for m in source.metadata())
            for name, tensor in source:
                err = (tensor.float().cpu() - reference[name]).abs().max().item()
                assert err < 2e-2, (name, err)
            print("ok")
            """
        )
    )
    result = subprocess.run(
        zero3_launch(script), capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-4000:]
