"""The arithmetic task of `make demo` and bench/learning.py (rlvr.data.arithmetic): splits that
share no problem, and a scripted solver whose demonstrations vf-deepscaler's own rubric scores
correct, written as SFT rows with the recipe's system prompt."""

from __future__ import annotations

import json

import pytest

from rlvr.data.arithmetic import arithmetic_splits, solver, write_jsonl
from rlvr.eval.demonstrations import parse_args, run

SYSTEM = "Answer with the result in \\boxed{}, like this: 2 + 2 = \\boxed{4}"


def test_splits_share_no_problem_and_their_answers_are_right():
    train, held_out = arithmetic_splits(held_out=40)
    assert len(held_out) == 40 and len(train) == 144 + 66 - 40
    assert not {r["problem"] for r in train} & {r["problem"] for r in held_out}
    for row in train + held_out:
        a, op, b = row["problem"].removeprefix("What is ").split("?")[0].split()
        assert int(row["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert arithmetic_splits(held_out=40) == (train, held_out)  # the same problems every run
    assert arithmetic_splits(held_out=40, seed=1)[1] != held_out
    with pytest.raises(ValueError, match="between 1 and"):
        arithmetic_splits(held_out=0)


def test_solver_demonstrations_score_correct_and_keep_the_system_prompt(tmp_path):
    train, _ = arithmetic_splits(held_out=40)
    data = write_jsonl(tmp_path / "train.jsonl", train[:12])
    out = tmp_path / "demos.jsonl"
    env_args = {"data_files": str(data), "system_prompt": SYSTEM}
    written = run(
        parse_args(
            [
                "--env",
                "vf-deepscaler",
                "--env-args",
                json.dumps(env_args),
                "--policy",
                "rlvr.data.arithmetic:solver",
                "--min-reward",
                "1",
                "--out",
                str(out),
            ]
        )
    )
    assert (written.kept, written.total, written.mean_reward) == (12, 12, 1.0)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    first = rows[0]["messages"]
    assert first[0] == {"role": "system", "content": SYSTEM}
    assert first[1]["content"] == train[0]["problem"]
    a, op, b = train[0]["problem"].removeprefix("What is ").split("?")[0].split()
    assert first[-1]["role"] == "assistant"
    assert first[-1]["content"] == f"{a} {op} {b} = \\boxed{{{train[0]['answer']}}}"


def test_solver_refuses_a_prompt_without_a_question():
    policy = solver(0)
    assert policy([{"role": "user", "content": "What is 12 - 5? Box it."}]) == "12 - 5 = \\boxed{7}"
    with pytest.raises(ValueError, match="no 'What is A \\+ B\\?' question"):
        policy([{"role": "user", "content": "Tell me a story."}])
