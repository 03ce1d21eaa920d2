"""The main job on the embedded default model (`make demo`), end to end on this machine:

1. serve SmolLM2-135M-Instruct with vf-vllm;
2. chat with it;
3. push changed weights from a trainer process and show the answers change, then push the
   original weights back and show they return;
4. evaluate it on vf-deepscaler with vf-eval and print the mean reward;
5. run a few GRPO steps on vf-deepscaler through the same server, printing the reward per step;
6. shut everything down.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from rlvr.eval.vf_eval import run_vf_eval
from rlvr.model.names import ensure_embedded_model
from rlvr.server.process import VLLMServer
from rlvr.weight_sync.push import WeightSync

MODEL = "smollm2-135m"
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 7 + 5?"]
SERVER_FLAGS = [
    "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
]  # fmt: skip
BIN = Path(sys.executable).parent


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def chat(server: VLLMServer, question: str) -> str:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0,
    }
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"].strip().replace("\n", " ")


def ask_all(server: VLLMServer) -> list[str]:
    answers = [chat(server, q) for q in QUESTIONS]
    for question, answer in zip(QUESTIONS, answers, strict=True):
        print(f"  Q: {question}\n  A: {answer[:100]}")
    return answers


def weight_push_demo(server: VLLMServer) -> None:
    from transformers import AutoModelForCausalLM

    banner("chat with the served model")
    original = ask_all(server)
    model = AutoModelForCausalLM.from_pretrained(ensure_embedded_model(), dtype=torch.float32)
    saved = {name: p.detach().clone() for name, p in model.named_parameters()}
    with WeightSync(server.base_url) as sync:
        sync.connect(model)
        banner(f"push perturbed weights ({sync.backend} transfer)")
        torch.manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * p.std() * torch.randn_like(p))
        print(f"  pushed in {sync.push():.2f}s")
        changed = ask_all(server)
        banner("push the original weights back")
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(saved[name])
        print(f"  pushed in {sync.push():.2f}s")
        restored = ask_all(server)
    differ = sum(a != b for a, b in zip(original, changed, strict=True))
    print(f"\n  answers changed after the push: {differ}/{len(QUESTIONS)}; "
          f"restored exactly: {restored == original}")  # fmt: skip
    if differ == 0 or restored != original:
        raise SystemExit("demo failed: the served outputs did not follow the pushed weights")


def eval_demo(server: VLLMServer, examples: int) -> None:
    banner(f"vf-eval vf-deepscaler on {examples} generated problems")
    with tempfile.TemporaryDirectory() as out:
        try:
            rows = run_vf_eval(
                "vf-deepscaler",
                model=server.model,
                base_url=server.base_url,
                output_dir=Path(out),
                num_examples=examples,
                max_tokens=256,
                env_args={"seed": 0},
                timeout=None,
            )
        except RuntimeError as error:
            raise SystemExit(str(error)) from error
    rewards = [row["reward"] for row in rows]
    print(f"  {len(rewards)} rollouts, mean reward {sum(rewards) / max(len(rewards), 1):.3f}")


def train_demo(server: VLLMServer, steps: int, output_dir: Path) -> None:
    banner(f"{steps} GRPO steps of vf-deepscaler on {MODEL} (CPU, LoRA)")
    root = Path(__file__).resolve().parents[2]
    cmd = [
        str(BIN / "python"), str(root / "scripts" / "train.py"),
        "--config", str(root / "configs" / "examples" / "deepscaler_smollm2_cpu.yaml"),
        f"server.base_url={server.base_url}", f"max_steps={steps}",
        "env.args={seed: 0}",  # generated problems: no dataset download, no local file needed
        f"output_dir={output_dir}", "wandb.mode=disabled",
    ]  # fmt: skip
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rlvr-demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval-examples", type=int, default=8)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--output-dir", default="outputs/demo")
    args = parser.parse_args(argv)

    start = time.time()
    banner(f"preparing the embedded model ({MODEL})")
    print(f"  {ensure_embedded_model()}")
    banner("starting vf-vllm (first start compiles kernels: 1-3 minutes on 2 cores)")
    with VLLMServer(MODEL, extra_args=SERVER_FLAGS) as server:
        print(f"  serving {MODEL} at {server.base_url} (log: {server.log_path})")
        weight_push_demo(server)
        if args.eval_examples > 0:
            eval_demo(server, args.eval_examples)
        if args.train_steps > 0:
            train_demo(server, args.train_steps, Path(args.output_dir))
        banner("shutting down vf-vllm")
    print(f"  done in {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
