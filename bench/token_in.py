"""Token-in multi-turn rollouts (`rollouts.token_in`): samples per rollout and trainer tokens per
step, token_in off vs on, on the same multi-turn tool rollouts.

The tiny test model served by vf-vllm with a Qwen3-style chat template (`--chat-template`:
thinking off, so every generation prompt opens with an empty `<think>` block that re-rendered
past turns drop; tests/toy_env.py `think_stripping_template`), on `tool_answers_env` (tool results
after each model turn, a user message before the last). One step: `--prompts` prompts x
`--group` rollouts x `--turns` turns of at most `--max-tokens` tokens, seeded, generated once with
token_in off and once on. For each it prints

    token_in_samples_per_rollout=   training samples per rollout (rlvr.rollouts.to_samples)
    token_in_tokens_per_step=       tokens the trainer forwards for the step unshared (the sum
                                    of the samples' lengths)
    token_in_tree_tokens_per_step=  the same with prefix sharing (rlvr.layout.prefix_tree's
                                    folded rows: each shared prefix once)

Run:  .venv/bin/python bench/token_in.py [--prompts 2] [--group 8] [--turns 4] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
from common import save  # noqa: E402
from toy_env import think_stripping_template, tool_answers_env  # noqa: E402

from rlvr.batch import Sample  # noqa: E402
from rlvr.config import RolloutsConfig  # noqa: E402
from rlvr.layout.prefix_tree import fold_rows, folded_width  # noqa: E402
from rlvr.model.tiny_model import build_tiny_model  # noqa: E402
from rlvr.rollouts.client import make_client  # noqa: E402
from rlvr.rollouts.groups import run_group  # noqa: E402
from rlvr.server.process import EXACT_FLAGS, VLLMServer  # noqa: E402

MAX_SEQ_LEN = 4096


async def step_samples(server: VLLMServer, args: argparse.Namespace, token_in: bool):
    """One step's rollouts with token_in on or off: (rollouts, their samples)."""
    env = tool_answers_env(target=0, turns=args.turns, num_prompts=args.prompts)
    client = make_client(
        server.base_url, None, 600, 64, training=False, rollouts=RolloutsConfig(token_in=token_in)
    )
    sampling = [
        {
            "temperature": 1.0,
            "max_tokens": args.max_tokens,
            "seed": 1000 * p + r,
            "logprobs": True,
            "extra_body": {"return_token_ids": True, "min_tokens": 8},
        }
        for p in range(args.prompts)
        for r in range(args.group)
    ]
    rows = env.get_dataset().select(range(args.prompts))
    try:
        groups = await asyncio.gather(
            *(
                run_group(
                    env,
                    client,
                    server.model,
                    row,
                    sampling[p * args.group : (p + 1) * args.group],
                    MAX_SEQ_LEN,
                    False,
                )
                for p, row in enumerate(rows)
            )
        )
    finally:
        await client.close()
    errored = sum(g.errored for g in groups)
    if errored:
        raise SystemExit(f"{errored} rollouts errored: {[e for g in groups for e in g.errors]}")
    rollouts = [r for g in groups for r in g.rollouts]
    return rollouts, [s for r in rollouts for s in r.samples]


def measure(rollouts: list, samples: list[Sample]) -> dict[str, float]:
    return {
        "samples_per_rollout": len(samples) / len(rollouts),
        "tokens_per_step": sum(len(s) for s in samples),
        "tree_tokens_per_step": sum(map(folded_width, fold_rows(samples, MAX_SEQ_LEN))),
        "turns_per_rollout": sum(r.num_turns for r in rollouts) / len(rollouts),
        "completion_tokens_per_step": sum(r.completion_tokens for r in rollouts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "tiny")
        template = Path(tmp) / "think_stripping.jinja"
        template.write_text(think_stripping_template())
        flags = [*EXACT_FLAGS, "--chat-template", str(template)]
        server = VLLMServer(str(model), extra_args=flags, log_path=Path(tmp) / "vf-vllm.log")
        server.start()
        try:
            results = {}
            for token_in in (False, True):
                results[token_in] = measure(*asyncio.run(step_samples(server, args, token_in)))
        finally:
            server.stop()
    for token_in, numbers in results.items():
        label = f"token_in={str(token_in).lower()}"
        print(f"token_in_samples_per_rollout={numbers['samples_per_rollout']:.2f} {label}")
        print(f"token_in_tokens_per_step={numbers['tokens_per_step']} {label}")
        print(f"token_in_tree_tokens_per_step={numbers['tree_tokens_per_step']} {label}")
    off, on = results[False], results[True]
    print(f"token_in_tokens_ratio={off['tokens_per_step'] / on['tokens_per_step']:.2f}")
    save(
        "token_in",
        {
            "args": vars(args),
            "token_in_off": off,
            "token_in_on": on,
        },
    )


if __name__ == "__main__":
    main()
