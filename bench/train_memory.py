"""Peak memory of a GRPO training step against tokens per micro-batch, with and without gradient
checkpointing, beside rlvr.trainer.memory's estimate of it.

SmolLM2-135M-Instruct (the embedded model) with the default LoRA adapter, in its default dtype,
loaded and stepped by the trainer's own code (rlvr.model.policy.load_policy, rlvr.trainer.optimizer,
rlvr.trainer.step.micro_batch_loss). Rows shaped like issue 22's tool environment: `--row-len`
tokens (570) of which the last `--loss-tokens` (96) are the completion. Each measurement runs in
a fresh process, so its peak is its own: a warm-up step first (AdamW's states and lazy
initialisation then exist, as from the second step of a run), then one step on a micro-batch of
`tokens // row-len` rows, whose peak resident memory (VmHWM after resetting it; on CUDA,
torch.cuda.max_memory_allocated) is the figure, printed beside rlvr.trainer.memory's estimate of the
whole process's peak and their ratio. The estimate counts every slot as a loss token (its worst
case), so with 96 of 570 it is high by part of the head's share; `--loss-tokens 0` makes every
token a loss token. glibc's heap makes CPU peaks vary from run to run (see
rlvr.trainer.memory.HEAP_RETENTION).

`--bases` compares the frozen base's storage in one run: `auto` (the default dtype), `float32`,
`bfloat16`, or a quantized base under LoRA (QLoRA, rlvr.model.quantization): `nf4`, `int8`
(stored quantized, computing in the default dtype). Each row also gives the measured step's
wall time (forward, backward and optimizer step; `--threads` threads).

Run:  .venv/bin/python bench/train_memory.py [--tokens 570 1140 2280] [--row-len 570]
          [--loss-tokens 96] [--checkpointing off on] [--device cpu]
          [--bases auto | float32 bfloat16 nf4 int8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

GIB = 2**30
BASES = ("auto", "float32", "bfloat16", "nf4", "int8")


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def micro_batch(rows: int, row_len: int, loss_tokens: int, vocab: int):
    """`rows` rows of random tokens whose last `loss_tokens` (all when 0) get loss."""
    import torch

    from rlvr.batch import Sample
    from rlvr.layout.micro_batches import collate

    loss = loss_tokens or row_len
    g = torch.Generator().manual_seed(0)
    samples = [
        Sample(
            torch.randint(0, vocab, (row_len,), generator=g).tolist(),
            [0] * (row_len - loss) + [1] * loss,
            [-1.0] * row_len,
            advantage=1.0,
        )
        for _ in range(rows)
    ]
    return collate([[s] for s in samples], 0)


def train_step(model, opt, mb, device) -> None:
    """One micro-batch's forward and backward and the optimizer step, as the trainer runs them."""
    from rlvr.config import Config
    from rlvr.trainer.step import micro_batch_loss

    mb = mb.to(device)
    loss, _ = micro_batch_loss(model, mb, Config(), float(mb.num_loss_tokens), 1)
    opt.backward(loss, True)
    opt.step(True)


def worker(args: argparse.Namespace) -> dict:
    """One measurement, in this process."""
    import torch
    from accelerate import Accelerator

    from rlvr.config import LoraConfig, ModelConfig, OptimConfig
    from rlvr.model.policy import enable_gradient_checkpointing, load_policy
    from rlvr.trainer import memory
    from rlvr.trainer.optimizer import Optimization

    torch.set_num_threads(args.threads)
    runtime = resident_bytes()
    acc = Accelerator(cpu=args.device == "cpu")
    checkpointing = args.worker == "on"
    model_cfg = ModelConfig(**base_settings(args.base))
    policy = load_policy(model_cfg, LoraConfig(), acc)
    if checkpointing:
        enable_gradient_checkpointing(policy.model)
    shape = memory.ModelShape.of(policy.model)
    opt = Optimization(acc, policy.model, OptimConfig(), total_steps=10, micro_batch_size=1)
    device = acc.device
    opt.model.train()
    train_step(opt.model, opt, micro_batch(1, 64, 0, shape.vocab), device)  # warm-up
    rows = max(args.tokens[0] // args.row_len, 1)
    mb = micro_batch(rows, args.row_len, args.loss_tokens, shape.vocab)
    memory.reset_peak(device)
    start = time.perf_counter()
    train_step(opt.model, opt, mb, device)
    seconds = time.perf_counter() - start
    peak = memory.peak_bytes(device)
    est = memory.estimate(shape, rows * args.row_len, checkpointing, on_cpu=device.type == "cpu")
    return {
        "base": args.base,
        "step_s": seconds,
        "weights_gib": est.weights / GIB,
        "checkpointing": checkpointing,
        "tokens": rows * args.row_len,
        "rows": rows,
        "loss_tokens": int(mb.num_loss_tokens),
        "runtime_gib": runtime / GIB,
        "peak_gib": peak / GIB,
        "estimate_gib": est.total / GIB,
        "estimate_over_peak": est.total / peak,
        "estimate": est.describe(),
    }


def base_settings(base: str) -> dict[str, str]:
    """ModelConfig fields of a `--bases` choice: a dtype, or a quantization of the default one."""
    if base in ("nf4", "int8"):
        return {"quantization": base}
    return {"dtype": base}


def measure(args: argparse.Namespace, tokens: int, checkpointing: str, base: str) -> dict:
    argv = [sys.executable, __file__, "--worker", checkpointing, "--tokens", str(tokens)]
    argv += ["--base", base]
    for key in ("row_len", "loss_tokens", "device", "threads"):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{tokens} tokens, checkpointing {checkpointing}, base {base}:\n{done.stderr[-3000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[570, 1140, 2280])
    parser.add_argument("--row-len", type=int, default=570)
    parser.add_argument("--loss-tokens", type=int, default=96)
    parser.add_argument("--checkpointing", nargs="+", choices=["off", "on"], default=["off", "on"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--bases", nargs="+", choices=BASES, default=["auto"], help="the frozen base's storage"
    )
    parser.add_argument("--worker", choices=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--base", choices=BASES, default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    print(
        f"SmolLM2-135M + LoRA, rows of {args.row_len} tokens ({args.loss_tokens or 'all'} "
        f"with loss), {args.device}; GiB"
    )
    print(
        f"{'base':>8} {'tokens':>7} {'ckpt':>4} {'peak':>7} {'estimate':>8} {'est/peak':>8} "
        f"{'weights':>7} {'step s':>7}"
    )
    runs = []
    for tokens in args.tokens:
        for checkpointing in args.checkpointing:
            for base in args.bases:
                r = measure(args, tokens, checkpointing, base)
                runs.append(r)
                print(
                    f"{base:>8} {r['tokens']:7d} {checkpointing:>4} {r['peak_gib']:7.2f} "
                    f"{r['estimate_gib']:8.2f} {r['estimate_over_peak']:8.2f} "
                    f"{r['weights_gib']:7.3f} {r['step_s']:7.2f}"
                )
    skip = ("worker", "base")
    save("train_memory", {**{k: v for k, v in vars(args).items() if k not in skip}, "runs": runs})


if __name__ == "__main__":
    main()
