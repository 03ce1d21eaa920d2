"""Small-number arithmetic through vf-deepscaler, where the embedded SmolLM2-135M scores low but
not zero (`make demo`, bench/learning.py): `arithmetic_splits` (train and held-out `a + b`,
`a - b` rows sharing no problem), `write_jsonl`, and `solver`, a scripted policy for
`rlvr-demos` (`7 + 5 = \\boxed{12}`). `python -m rlvr.data.arithmetic DIR [--held-out 40]`
writes DIR/train.jsonl and DIR/heldout.jsonl.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_write_text
from rlvr.scripted import Policy

# SmolLM2-135M-Instruct rarely boxes an answer unless the question itself asks (measured:
# docs/benchmarks.md, "Does it learn?")
QUESTION = "What is {a} {op} {b}? Give only the number, in \\boxed{{}}."
QUESTION_RE = re.compile(r"What is (\d+) ([+-]) (\d+)\?")


def arithmetic_splits(held_out: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Every `a + b` and `a - b` (a > b) with 1 <= a, b <= 12, shuffled with `seed`: the first
    `held_out` problems for evaluation, the rest for training. Returns (training, held-out)."""
    problems = [(a, "+", b, a + b) for a in range(1, 13) for b in range(1, 13)]
    problems += [(a, "-", b, a - b) for a in range(1, 13) for b in range(1, a)]
    random.Random(seed).shuffle(problems)
    if not 0 < held_out < len(problems):
        raise ValueError(f"held-out problems must be between 1 and {len(problems) - 1}")
    rows = [
        {"problem": QUESTION.format(a=a, op=op, b=b), "answer": str(r)} for a, op, b, r in problems
    ]
    return rows[held_out:], rows[:held_out]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as JSONL at `path` (parents created), written atomically."""
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    return path


def solver(seed: int) -> Policy:
    """A policy factory (rlvr.eval.demonstrations): the policy answers the last question with
    its working and the boxed result, `7 + 5 = \\boxed{12}`, the form the recipe's system
    prompt shows. A prompt without such a question is an error: that rollout is not kept."""
    del seed  # deterministic: one right answer

    def policy(messages: list[Any]) -> str:
        content = messages[-1]["content"] if messages else ""
        match = QUESTION_RE.search(content if isinstance(content, str) else "")
        if match is None:
            raise ValueError(f"no 'What is A + B?' question in {content!r}")
        a, op, b = int(match[1]), match[2], int(match[3])
        return f"{a} {op} {b} = \\boxed{{{a + b if op == '+' else a - b}}}"

    return policy


def main(argv: list[str] | None = None) -> None:
    """Write train.jsonl and heldout.jsonl for vf-deepscaler to the given directory."""
    parser = argparse.ArgumentParser(description="Write the arithmetic splits for vf-deepscaler.")
    parser.add_argument("out", type=Path, help="directory for train.jsonl and heldout.jsonl")
    parser.add_argument("--held-out", type=int, default=40, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed")
    args = parser.parse_args(argv)
    try:
        train, held_out = arithmetic_splits(args.held_out, args.seed)
    except ValueError as e:
        parser.error(str(e))
    for name, rows in (("train", train), ("heldout", held_out)):
        print(f"{len(rows)} problems in {write_jsonl(args.out / f'{name}.jsonl', rows)}")


if __name__ == "__main__":
    main()
