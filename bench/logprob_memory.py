"""Peak memory of one training micro-batch's log-probabilities: full-vocabulary logits (the
trainer's old path, kept here only as the baseline) vs rlvr.trainer.logprobs' chunked head, in one
run.

A Llama-style model with a 32k vocabulary (small trunk: the head and the log-softmax are what
differ) on a micro-batch of 4 x 4096 tokens whose second halves are loss tokens (a GRPO
completion after its prompt). Each path runs forward + entropy + backward in a fresh process:
on the CPU the figure is the rise of the process's peak resident memory (ru_maxrss) over its
resident memory just before the step; on CUDA, torch.cuda.max_memory_allocated over the
memory allocated before it. A third process runs the trunk alone (no loss token, so no head):
the floor both paths share. The log-probabilities of both paths are compared as well.

Run:  .venv/bin/python bench/logprob_memory.py [--rows 4] [--seq-len 4096] [--vocab 32000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

PATHS = ("full_logits", "chunked", "trunk_only")


def full_logits(model, mb, temperature: float):
    """The old path: every position's logits, widened to float32 as a whole (and the padding
    masked, as the trainer then did)."""
    import torch

    inputs = {"input_ids": mb.input_ids, "attention_mask": mb.attention_mask}
    logits = model(**inputs, use_cache=False).logits
    shifted = logits[:, :-1].float() / temperature
    picked = torch.gather(shifted, -1, mb.input_ids[:, 1:, None])[..., 0]
    logprobs = picked - torch.logsumexp(shifted, dim=-1)
    with torch.no_grad():
        loss_logits = shifted[mb.loss_mask.bool()]
        logp = torch.log_softmax(loss_logits, dim=-1)
        entropy = -(logp.exp() * logp).sum()
    return logprobs * mb.loss_mask, entropy


def chunked(model, mb, temperature: float):
    from rlvr.trainer.logprobs import sequence_scores

    scores = sequence_scores(model, mb, temperature, with_entropy=True)
    return scores.logprobs, scores.entropy_sum


def trunk_only(model, mb, temperature: float):
    """The floor: the same forward and backward with no loss token, so the head never runs."""
    mb.loss_mask.zero_()
    return chunked(model, mb, temperature)


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def make_model(args: argparse.Namespace):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).float().to(args.device).train()


def make_batch(args: argparse.Namespace, rows: int, seq_len: int):
    """Rows whose first halves are prompts (no loss) and second halves completions."""
    import torch

    from rlvr.batch import Sample
    from rlvr.layout.micro_batches import collate

    half = seq_len // 2
    samples = [
        Sample(
            torch.randint(0, args.vocab, (seq_len,)).tolist(),
            [0] * half + [1] * (seq_len - half),
            [0.0] * seq_len,
            advantage=1.0,
        )
        for _ in range(rows)
    ]
    return collate([[s] for s in samples], 0).to(args.device)


def worker(args: argparse.Namespace) -> dict:
    """One path's step, in this process: peak memory above the start, time, a checksum."""
    import torch

    step = {"full_logits": full_logits, "chunked": chunked, "trunk_only": trunk_only}[args.worker]
    model = make_model(args)
    warm_up = make_batch(args, 2, 64)
    # a small step first: lazy initialisation and the parameters' gradient buffers are then
    # part of the starting point, not of the figure
    (step(model, warm_up, 1.0)[0] * warm_up.advantages).sum().backward()
    mb = make_batch(args, args.rows, args.seq_len)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = resident_bytes()
    began = time.perf_counter()
    logprobs, entropy = step(model, mb, 1.0)
    (logprobs * mb.advantages).sum().backward()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seconds = time.perf_counter() - began
    return {
        "path": args.worker,
        "peak_above_start_mib": (peak - before) / 2**20,
        "seconds": seconds,
        "logprob_sum": float(logprobs.sum()),
        "entropy_sum": float(entropy),
    }


def run_path(path: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, __file__, "--worker", path]
    for key in ("rows", "seq_len", "vocab", "hidden", "layers", "device"):
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--worker", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    runs = {path: run_path(path, args) for path in PATHS}
    old, new, floor = runs["full_logits"], runs["chunked"], runs["trunk_only"]
    full_copy_mib = args.rows * (args.seq_len - 1) * args.vocab * 4 / 2**20
    print(
        f"{args.rows} x {args.seq_len} tokens, vocabulary {args.vocab}, {args.device}; "
        f"one float32 copy of the micro-batch's logits: {full_copy_mib:.0f} MiB"
    )
    print(f"{'path':>12} {'peak MiB':>9} {'seconds':>8} {'logprob sum':>13} {'entropy sum':>13}")
    for r in runs.values():
        print(
            f"{r['path']:>12} {r['peak_above_start_mib']:9.0f} {r['seconds']:8.2f} "
            f"{r['logprob_sum']:13.2f} {r['entropy_sum']:13.2f}"
        )
    ratio = old["peak_above_start_mib"] / max(new["peak_above_start_mib"], 1e-9)
    above_floor = [r["peak_above_start_mib"] - floor["peak_above_start_mib"] for r in (old, new)]
    print(
        f"peak memory: full logits / chunked = {ratio:.1f}x; above the trunk's own: "
        f"{above_floor[0]:.0f} MiB vs {above_floor[1]:.0f} MiB"
    )
    save(
        "logprob_memory",
        {
            **{k: v for k, v in vars(args).items() if k != "worker"},
            "full_logits_copy_mib": full_copy_mib,
            "runs": list(runs.values()),
            "peak_ratio": ratio,
            "head_mib_above_trunk": {"full_logits": above_floor[0], "chunked": above_floor[1]},
            "time_ratio": old["seconds"] / new["seconds"],
            "logprob_sum_rel_diff": abs(old["logprob_sum"] - new["logprob_sum"])
            / abs(old["logprob_sum"]),
        },
    )


if __name__ == "__main__":
    main()
