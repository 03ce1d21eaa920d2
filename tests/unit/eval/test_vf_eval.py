"""rlvr.eval.vf_eval.run_vf_eval without a model server: the real vf-eval's own error reaches the
caller, and (with a stand-in vf-eval script) a run that saves nothing is an error while saved rows
come back with the command line users would type."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlvr.eval import vf_eval
from rlvr.eval.vf_eval import run_vf_eval

UNREACHABLE = "http://127.0.0.1:9/v1"


def fake_vf_eval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """Points run_vf_eval at a script that runs `body` with `args` (its argv) and `out` (-o)."""
    script = tmp_path / "vf-eval"
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys\nfrom pathlib import Path\n"
        f"args = sys.argv[1:]\nout = Path(args[args.index('-o') + 1])\n{body}\n"
    )
    script.chmod(0o755)
    monkeypatch.setattr(vf_eval, "VF_EVAL", script)


@pytest.mark.slow
def test_unknown_environment_raises_with_vf_evals_error(tmp_path: Path):
    """The real vf-eval accepts every flag run_vf_eval builds, then fails on the env id."""
    with pytest.raises(RuntimeError, match="failed with exit code") as err:
        run_vf_eval(
            "vf-does-not-exist",
            model="m",
            base_url=UNREACHABLE,
            output_dir=tmp_path,
            num_examples=1,
            max_tokens=8,
            env_args={"seed": 0},
            state_columns=["turn", "timing"],
            timeout=300,
        )
    assert "Could not import 'vf-does-not-exist' environment" in str(err.value)


def test_a_run_that_saves_nothing_raises_with_its_output(tmp_path: Path, monkeypatch):
    fake_vf_eval(tmp_path, monkeypatch, "print('evaluated nothing'); sys.exit(0)")
    with pytest.raises(RuntimeError, match="saved no results") as err:
        run_vf_eval("vf-x", model="m", base_url=UNREACHABLE, output_dir=tmp_path, num_examples=1)
    assert "evaluated nothing" in str(err.value)


def test_failure_carries_the_tails_of_stdout_and_stderr(tmp_path: Path, monkeypatch):
    body = "print('x' * 10000 + 'OUT-END'); print('ERR-END', file=sys.stderr); sys.exit(3)"
    fake_vf_eval(tmp_path, monkeypatch, body)
    with pytest.raises(RuntimeError, match="exit code 3") as err:
        run_vf_eval("vf-x", model="m", base_url=UNREACHABLE, output_dir=tmp_path, num_examples=1)
    message = str(err.value)
    assert "OUT-END" in message and "ERR-END" in message
    assert len(message) < 7000  # tails, not the whole output


# The start of every vf-eval command line these tests build: environment, model, server, key.
SERVED_ARGS = ["vf-x", "-m", "m", "-b", "http://host:1/v1", "-k", vf_eval.API_KEY_VAR]


def test_saved_rows_come_back_and_the_command_line_is_complete(tmp_path: Path, monkeypatch):
    body = (
        "run = out / 'vf-x--m' / 'abc'; run.mkdir(parents=True)\n"
        "key = os.environ[args[args.index('-k') + 1]]\n"
        "rows = [{'reward': 1.0, 'args': args, 'key': key}, {'reward': 0.0}]\n"
        "(run / 'results.jsonl').write_text('\\n'.join(json.dumps(r) for r in rows) + '\\n\\n')"
    )
    fake_vf_eval(tmp_path, monkeypatch, body)
    out = tmp_path / "out"
    rows = run_vf_eval(
        "vf-x",
        model="m",
        base_url="http://host:1/v1",
        output_dir=out,
        num_examples=2,
        rollouts_per_example=3,
        max_tokens=64,
        env_args={"max_turns": 2},
        state_columns=["a", "b"],
    )
    assert [row["reward"] for row in rows] == [1.0, 0.0]
    assert rows[0]["key"] == "EMPTY"
    counts = ["-n", "2", "-r", "3"]
    options = ["-t", "64", "-a", '{"max_turns": 2}', "-C", "a,b"]
    assert rows[0]["args"] == [*SERVED_ARGS, *counts, "-s", "-d", "-o", str(out), *options]


def test_no_counts_leave_n_and_r_to_the_environments_defaults(tmp_path: Path, monkeypatch):
    body = (
        "run = out / 'vf-x--m' / 'abc'; run.mkdir(parents=True)\n"
        "(run / 'results.jsonl').write_text(json.dumps({'args': args}) + '\\n')"
    )
    fake_vf_eval(tmp_path, monkeypatch, body)
    out = tmp_path / "out"
    [row] = run_vf_eval(
        "vf-x",
        model="m",
        base_url="http://host:1/v1",
        output_dir=out,
        num_examples=None,
        rollouts_per_example=None,
    )
    assert row["args"] == [*SERVED_ARGS, "-s", "-d", "-o", str(out)]
