"""How many tokens an honest reply needs in each environment: the basis of their default
`max_tokens` (each environment's README states its default and this measurement).

An honest reply is written from the row's own reference, then counted with the embedded
SmolLM2-135M-Instruct tokenizer (plus the end-of-turn token):
- vf-deepscaler: the reference `solution` (DeepScaleR's worked solution, which ends boxed), and
  the same inside `<think>...</think>` followed by the boxed answer (`use_think`);
- vf-musique: each turn's tool call in the hermes format the chat template emits: a
  `retrieve_documents` query per hop (MuSiQue's decomposition, earlier answers filled in), then
  `submit_answer` with the gold answer and the supporting document ids;
- vf-openspiel: `<move>...</move>` around the longest legal move of each first turn;
- vf-planner: a decomposed plan in the environment's JSON (one subproblem per step of the GSM8K
  reference solution, at most 4, and the last step as the plan), and the worker's direct solve
  (the reference solution ending `Answer: N`), which bounds `worker_max_tokens`.
The model's own replies are no measure: SmolLM2 rarely answers in the format, and without a
limit it rambles to the end of its context.

Run: .venv/bin/python bench/reply_lengths.py   (about a minute; no server needed)

Prints p50 / p99 / max tokens per environment and reply kind beside the default `max_tokens`
and the share of honest replies that fit in it, and saves them to bench/results/reply_lengths.json.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from transformers import AutoTokenizer

from rlvr.model.names import ensure_embedded_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save, summary  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ANNOTATION = re.compile(r"<<[^>]*>>")


def deepscaler_replies(think: bool) -> Iterable[str]:
    """The reference solution of every row, optionally as a think block before the answer."""
    for line in (DATA / "deepscaler" / "preview_first803.jsonl").open():
        row = json.loads(line)
        if think:
            yield f"<think>\n{row['solution']}\n</think>\n\\boxed{{{row['answer']}}}"
        else:
            yield row["solution"]


def tool_call(name: str, arguments: dict) -> str:
    """One hermes-style tool call, as SmolLM2's chat template writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def musique_replies() -> Iterable[str]:
    """Every turn of an honest episode: one query per hop, then the submission."""
    for line in (DATA / "musique" / "dev_sample.jsonl").open():
        row = json.loads(line)
        answers: list[str] = []
        for hop in row["question_decomposition"]:
            query = hop["question"].replace(">>", " ")
            for k, answer in enumerate(answers, start=1):
                query = query.replace(f"#{k}", answer)
            answers.append(hop["answer"])
            yield tool_call("retrieve_documents", {"query": query})
        cited = [str(p["idx"]) for p in row["paragraphs"] if p["is_supporting"]]
        yield tool_call("submit_answer", {"answer": row["answer"], "cited_doc_ids": cited})


def openspiel_replies() -> Iterable[str]:
    """The longest legal move of each first turn, in its tag (default cases and the README's)."""
    import vf_openspiel

    for args in ({}, {"game_types": "tic_tac_toe,connect_four", "opponent": "mcts"}):
        env = vf_openspiel.load_environment(num_tasks_per_case=4, **args)
        for row in env.get_eval_dataset():
            prompt = row["prompt"][-1]["content"]
            moves = re.findall(r"^\s*\d+: (.+)$", prompt, flags=re.MULTILINE)
            yield f"<move>{max(moves, key=len)}</move>"


def gsm8k_rows() -> Iterable[tuple[list[str], str]]:
    """(solution steps without calculator annotations, final answer) of every GSM8K test row."""
    for line in (DATA / "gsm8k" / "test.jsonl").open():
        row = json.loads(line)
        solution, final = row["answer"].split("####")
        steps = [ANNOTATION.sub("", s).strip() for s in solution.strip().splitlines() if s.strip()]
        yield steps, final.strip()


def planner_replies() -> Iterable[str]:
    """A decomposed plan: one subproblem per reference step (at most 4), the last as the plan."""
    for steps, _ in gsm8k_rows():
        subproblems = [f"Work out: {step}" for step in steps[:-1][:4]]
        yield json.dumps(
            {"should_decompose": bool(subproblems), "subproblems": subproblems, "plan": steps[-1]}
        )


def worker_replies() -> Iterable[str]:
    """The worker's direct solve: the reference solution and its answer line."""
    for steps, final in gsm8k_rows():
        yield "\n".join(steps) + f"\nAnswer: {final}"


def measure(count: Callable[[str], int]) -> list[dict]:
    """One row per environment and reply kind, with the default it is compared against."""
    from vf_deepscaler import DEFAULT_SAMPLING_ARGS as DEEPSCALER
    from vf_musique import DEFAULT_SAMPLING_ARGS as MUSIQUE
    from vf_openspiel import DEFAULT_SAMPLING_ARGS as OPENSPIEL
    from vf_planner import DEFAULT_SAMPLING_ARGS as PLANNER
    from vf_planner import load_environment as planner_env

    worker_default = inspect.signature(planner_env).parameters["worker_max_tokens"].default
    kinds = [
        ("vf-deepscaler", "solution", deepscaler_replies(False), DEEPSCALER["max_tokens"]),
        ("vf-deepscaler", "use_think", deepscaler_replies(True), DEEPSCALER["max_tokens"]),
        ("vf-musique", "tool call", musique_replies(), MUSIQUE["max_tokens"]),
        ("vf-openspiel", "move", openspiel_replies(), OPENSPIEL["max_tokens"]),
        ("vf-planner", "plan", planner_replies(), PLANNER["max_tokens"]),
        ("vf-planner", "worker", worker_replies(), worker_default),
    ]
    rows = []
    for env, kind, replies, default in kinds:
        lengths = [count(r) for r in replies]
        fits = sum(n <= default for n in lengths) / len(lengths)
        rows.append(
            {"env": env, "reply": kind, "default": default, "fits": fits, **summary(lengths)}
        )
    return rows


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(ensure_embedded_model())

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids) + 1  # + <|im_end|>

    rows = measure(count)
    print(f"{'env':14s} {'reply':10s} {'n':>5s} {'p50':>5s} {'p99':>5s} {'max':>5s} default fits")
    for r in rows:
        print(
            f"{r['env']:14s} {r['reply']:10s} {r['n']:5d} {r['p50']:5.0f} {r['p99']:5.0f} "
            f"{r['max']:5.0f} {r['default']:7d} {r['fits']:5.1%}"
        )
    save("reply_lengths", {"tokenizer": "smollm2-135m", "rows": rows})


if __name__ == "__main__":
    main()
