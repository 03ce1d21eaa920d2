"""Demonstrations (rlvr.eval.demonstrations, `rlvr-demos`): real environment rows played through
`env.generate` with scripted policies, no server. The filter drops what it should, the rows it
writes are what SFT reads (loss on the assistant turns only, the environment's system prompt and
tools kept), and a bad `--policy` says what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf
from support import masked_runs
from transformers import AutoTokenizer

from rlvr.config import SFTDataConfig
from rlvr.data.sft_rows import assistant_mask, read_conversations, tokenize
from rlvr.eval.demonstrations import (
    PolicyError,
    load_policy_factory,
    main,
    parse_args,
    play,
    run,
    scripted_policy,
    write_demonstrations,
)
from rlvr.eval.export import Requirement, parse_requirement
from rlvr.eval.vf_eval import ResultsError
from rlvr.scripted import ScriptedClient

TIC_TAC_TOE = {"cases": "tic_tac_toe", "num_tasks_per_case": 24}


def demos(tmp_path: Path, *extra: str, name: str = "demos.jsonl") -> tuple[Path, Any]:
    """`rlvr-demos` on 24 tic-tac-toe games played by the quiet random mover."""
    out = tmp_path / name
    args = parse_args(
        [
            "--env",
            "vf-openspiel",
            "--env-args",
            json.dumps(TIC_TAC_TOE),
            "--policy",
            "vf_openspiel.scripted:quiet_mover",
            "--seed",
            "3",
            "--out",
            str(out),
            *extra,
        ]
    )
    return out, run(args)


def played_games(seed: int = 3) -> list[tuple[str, dict[str, Any]]]:
    env = vf.load_environment("vf-openspiel", **TIC_TAC_TOE)
    client = ScriptedClient(scripted_policy("vf_openspiel.scripted:quiet_mover", seed))
    rows = env.get_dataset().to_list()
    return play(env, rows, client=client, model="scripted", progress=False)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def masked_texts(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded stretches of consecutive loss tokens."""
    return [tokenizer.decode(run) for run in masked_runs(ids, mask)]


# ---- the filter --------------------------------------------------------------------------------


def test_rollouts_below_the_bar_are_dropped(tmp_path):
    played = played_games()
    rewards = [row["reward"] for _, row in played]
    assert len(played) == 24 and {0.0, 1.0} <= set(rewards)  # some games lost, some won

    out, written = demos(tmp_path, "--min-reward", "1")
    wins = [row for _, row in played if row["reward"] >= 1.0]
    assert (written.kept, written.total) == (len(wins), 24)
    lines = read_lines(out)
    assert [line["messages"] for line in lines] == [
        row["prompt"] + row["completion"] for row in wins
    ]
    assert all("you won" in line["messages"][-1]["content"] for line in lines)

    _, everything = demos(tmp_path, "--min-reward", "0")
    assert everything.kept == 24
    _, drawn_or_won = demos(tmp_path, "--min-reward", "0.5")
    assert drawn_or_won.kept == sum(r >= 0.5 for r in rewards) < 24


def test_metric_requirements_filter_too(tmp_path):
    played = played_games()
    short = [row for _, row in played if row["metrics"]["model_moves"] <= 2]
    assert 0 < len(short) < len(played)
    _, written = demos(tmp_path, "--min-reward", "0", "--require", "model_moves<=2")
    assert written.kept == len(short)
    _, both = demos(
        tmp_path, "--min-reward", "1", "--require", "model_moves<=2", "--require", "legal_rate>=1"
    )
    assert both.kept == sum(row["reward"] >= 1 for row in short)

    # an illegal game (random text) is kept by the reward bar 0 and dropped by legality
    env = vf.load_environment("vf-openspiel", **TIC_TAC_TOE)
    rows = env.get_dataset(n=2).to_list()
    babble = play(env, rows, client=ScriptedClient(lambda p: "no idea"), model="s", progress=False)
    assert [row["metrics"]["legal_rate"] for _, row in babble] == [0.0, 0.0]
    legal = [parse_requirement("legal_rate>=1")]
    assert write_demonstrations(babble, tmp_path / "b.jsonl", 0.0).kept == 2
    assert write_demonstrations(babble, tmp_path / "b.jsonl", 0.0, legal).kept == 0


def test_requirements_parse_and_name_unknown_metrics():
    assert parse_requirement("legal_rate>=1") == Requirement("legal_rate", ">=", 1.0)
    assert parse_requirement(" forfeit == 0 ") == Requirement("forfeit", "==", 0.0)
    assert str(parse_requirement("loss<0.5")) == "loss<0.5"
    for bad in ("legal_rate", "legal_rate=>1", ">=1", "legal_rate>=high"):
        with pytest.raises(ValueError, match="METRIC<op>NUMBER"):
            parse_requirement(bad)
    row = {"reward": 1.0, "metrics": {"win": 1.0}, "error": None}
    with pytest.raises(ResultsError, match=r"example 1: no metric 'wins' \(its metrics: win\)"):
        parse_requirement("wins>=1").holds(row, "example 1")


# ---- what SFT reads ----------------------------------------------------------------------------


def test_rows_load_in_the_sft_reader_with_loss_only_on_the_model_moves(tmp_path, tiny_model_dir):
    """The environment's system prompt, opening position, opponent moves and result are context;
    the loss covers each `<move>..</move>` reply and the token that ends it."""
    out, written = demos(tmp_path, "--min-reward", "1")
    cfg = SFTDataConfig(train_files=[str(out)])
    conversations = read_conversations([str(out)], cfg)
    assert len(conversations) == written.kept > 0
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    examples, stats = tokenize(conversations, tokenizer, cfg)
    assert stats.examples == written.kept and stats.dropped == stats.truncated == 0
    for conversation, example in zip(conversations, examples, strict=True):
        messages = conversation.messages
        assert messages[0]["role"] == "system" and "<move></move>" in messages[0]["content"]
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        ids, mask = example.sample.input_ids, example.sample.loss_mask
        assert masked_texts(tokenizer, ids, mask) == [f"{r}<|im_end|>" for r in replies]
        context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert messages[0]["content"] in context and "Game over: you won" in context
        assert "Your legal moves (id: move)" in context
    assert any("Player 1 played" in m["content"] for c in conversations for m in c.messages)


def test_parquet_rows_read_the_same(tmp_path):
    jsonl, _ = demos(tmp_path, "--min-reward", "1")
    parquet, _ = demos(tmp_path, "--min-reward", "1", name="demos.parquet")
    cfg = SFTDataConfig()
    as_jsonl = read_conversations([str(jsonl)], cfg)
    as_parquet = read_conversations([str(parquet)], cfg)
    assert [c.messages for c in as_parquet] == [c.messages for c in as_jsonl]


def searcher(seed: int):
    """A tool-calling policy factory for vf-musique: one search for the question, then an answer
    (`unanswerable`, no citations)."""

    def policy(prompt: list[Any]) -> list[vf.ToolCall]:
        if not any(_get(m, "role") == "tool" for m in prompt):
            question = next(_get(m, "content") for m in prompt if _get(m, "role") == "user")
            args = json.dumps({"query": question})
            return [vf.ToolCall(id=f"s{seed}", name="retrieve_documents", arguments=args)]
        answer = json.dumps({"answer": "unanswerable", "cited_doc_ids": []})
        return [vf.ToolCall(id="a", name="submit_answer", arguments=answer)]

    return policy


def _get(message: Any, name: str) -> Any:
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def test_tools_and_tool_turns_are_kept_and_get_no_loss(tmp_path, shared_data, tiny_model_dir):
    out = tmp_path / "musique.jsonl"
    env_args = {
        "data_files": str(shared_data / "musique" / "fixture_small.jsonl"),
        "retriever": "bm25",
    }
    main(
        [
            "--env",
            "vf-musique",
            "--env-args",
            json.dumps(env_args),
            "-n",
            "2",
            "--split",
            "eval",
            "--policy",
            f"{__name__}:searcher",
            "--min-reward",
            "0",
            "--out",
            str(out),
        ]
    )
    lines = read_lines(out)
    assert len(lines) == 2
    assert {tool["name"] for tool in lines[0]["tools"]} >= {  # as vf-eval saves them
        "retrieve_documents",
        "submit_answer",
    }
    conversation = read_conversations([str(out)], SFTDataConfig())[0]
    roles = [m["role"] for m in conversation.messages]
    assert roles[:2] == ["system", "user"] and "tool" in roles
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids, mask = assistant_mask(tokenizer, conversation.messages, "row 1", conversation.tools)
    loss = masked_texts(tokenizer, ids, mask)
    assert len(loss) == roles.count("assistant")
    assert all(text.startswith("<tool_call>") for text in loss)
    assert '"name": "retrieve_documents"' in loss[0] and '"name": "submit_answer"' in loss[-1]
    context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    assert "<tools>" in context and "<tool_response>" in context


# ---- a bad policy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("random_mover", "expected MODULE:FUNCTION"),
        ("vf_openspiel.scripted:", "expected MODULE:FUNCTION"),
        ("no_such_module:policy", "cannot import module 'no_such_module'"),
        ("vf_openspiel.scripted:no_such", "module 'vf_openspiel.scripted' has no 'no_such'"),
        ("vf_openspiel.scripted:LEGAL_HEADER", "'LEGAL_HEADER' is not callable"),
    ],
)
def test_a_bad_policy_names_what_is_wrong(spec, message):
    with pytest.raises(PolicyError, match=message):
        load_policy_factory(spec)


def test_a_factory_must_return_a_policy(tmp_path, capsys):
    with pytest.raises(PolicyError, match="must return a policy .* got str"):
        scripted_policy("builtins:str", 0)
    with pytest.raises(SystemExit, match="error: --policy 'no_such_module:f': cannot import"):
        main(
            ["--env", "vf-openspiel", "--policy", "no_such_module:f", "--out", str(tmp_path / "x")]
        )
    assert not (tmp_path / "x").exists()
