"""Every `vf-eval` line of the quickstarts (README.md's and each environment README's), parsed from
the READMEs so the two cannot drift, runs on the shared SmolLM2 server with a small -n, finishes,
and saves its results; single-turn replies stay within the environment's default max_tokens,
which vf-eval would otherwise leave unbounded (the lines pass no -t).

The lines run as written except: -m/-b/-k point at the test server, -n and -r are SMALL_N and
SMALL_R (one rollout shows the line runs; the environment tests check the eval tables' own
defaults), the data root `../shared/data` is the suite's (RLVR_SHARED_DATA), and -o keeps
results in tmp_path. Lines that differ only in those collapse into one run."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlvr.eval.vf_eval import find_results, iter_results

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", *sorted(ROOT.glob("environments/vf_*/README.md"))]
QUICKSTART = re.compile(r"^## Quickstart.*?$(.*?)^## ", re.MULTILINE | re.DOTALL)
BASH_BLOCK = re.compile(r"^```bash$(.*?)^```$", re.MULTILINE | re.DOTALL)
DATA_ROOT = "../shared/data"
SMALL_N = "1"
SMALL_R = "1"
API_KEY_VAR = "RLVR_README_KEY"
SINGLE_TURN = {"vf-deepscaler", "vf-planner"}
# Without a data file these read the Hub (vf-deepscaler falls back to generated problems).
HUB_ONLY = {"vf-musique", "vf-planner"}


def quickstart_lines(readme: Path) -> list[str]:
    """The vf-eval commands of a README's Quickstart section, continuation lines joined."""
    section = QUICKSTART.search(readme.read_text())
    assert section, f"{readme} has no Quickstart section"
    blocks = "\n".join(BASH_BLOCK.findall(section.group(1))).replace("\\\n", " ")
    return [line.strip() for line in blocks.splitlines() if line.strip().startswith("vf-eval ")]


def normalized(line: str) -> tuple[str, ...]:
    """The command's arguments with the server, key, -n and -r replaced (the README's data root
    kept, to be swapped at run time), so lines that differ only there compare equal."""
    args = shlex.split(line, comments=True)
    replace = {
        "-m": "{model}",
        "-b": "{base_url}",
        "-k": API_KEY_VAR,
        "-n": SMALL_N,
        "-r": SMALL_R,
    }
    out, i = [], 0
    while i < len(args):
        if args[i] in replace:
            out += [args[i], replace[args[i]]]
            i += 2
        else:
            out.append(args[i])
            i += 1
    for flag in ("-n", "-r"):
        if flag not in out:
            out += [flag, replace[flag]]
    return tuple(out)


def commands() -> dict[tuple[str, ...], str]:
    """Each distinct quickstart command, with the README line it came from (first seen)."""
    found: dict[tuple[str, ...], str] = {}
    for readme in READMES:
        for line in quickstart_lines(readme):
            found.setdefault(normalized(line), f"{readme.relative_to(ROOT)}: {line}")
    return found


COMMANDS = commands()


def option(args: tuple[str, ...], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_every_environment_has_a_quickstart_line_that_saves():
    envs = {args[1] for args in COMMANDS}
    assert envs == {"vf-deepscaler", "vf-musique", "vf-openspiel", "vf-planner"}
    for args, source in COMMANDS.items():
        assert "-s" in args, f"saves nothing: {source}"


def hub_only(args: tuple[str, ...]) -> bool:
    """A line that reads the Hugging Face Hub (no data file given) where the Hub is unreachable."""
    if args[1] not in HUB_ONLY or "data_files" in (option(args, "-a") or ""):
        return False
    from vf_musique.hub import hub_reachable

    return not hub_reachable()


@dataclass
class Run:
    """One README line started as a user runs it: results under `out`, its console in `log`
    (a file, not a pipe: a full pipe would stall the line until its test reads it)."""

    proc: subprocess.Popen
    out: Path

    @property
    def log(self) -> Path:
        return self.out.parent / f"{self.out.name}.log"


@pytest.fixture(scope="module")
def readme_runs(smollm2_server, shared_data, tmp_path_factory):
    """Every runnable line started at once on the shared server: each line is one rollout, and the
    server batches them (one stream at a time leaves most of a CPU's decode throughput unused)."""
    server = {"{model}": smollm2_server.model, "{base_url}": smollm2_server.base_url}
    env = {**os.environ, API_KEY_VAR: "EMPTY"}
    runs = {}
    for args in COMMANDS:
        if hub_only(args):
            continue
        cmd = [server.get(a, a.replace(DATA_ROOT, str(shared_data))) for a in args]
        cmd[0] = str(Path(sys.executable).with_name("vf-eval"))
        out = tmp_path_factory.mktemp("readme-line")
        with open(out.parent / f"{out.name}.log", "w") as log:
            proc = subprocess.Popen(
                [*cmd, "-o", str(out)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        runs[args] = Run(proc, out)
    yield runs
    for run in runs.values():
        run.proc.kill()
        run.proc.wait()


@pytest.mark.parametrize("args", list(COMMANDS), ids=[" ".join(a[1:]) for a in COMMANDS])
def test_readme_quickstart_vf_eval_line_runs(args, readme_runs):
    if args not in readme_runs:
        pytest.skip(f"{COMMANDS[args]}: reads the Hugging Face Hub, which is unreachable")
    run = readme_runs[args]
    returncode = run.proc.wait(timeout=900)
    assert returncode == 0, f"{COMMANDS[args]}\n{run.log.read_text()[-6000:]}"
    (results,) = find_results(run.out)
    rows = [row for _, row in iter_results(results)]
    metadata = json.loads((results.parent / "metadata.json").read_text())
    assert metadata["rollouts_per_example"] == int(SMALL_R)
    assert len(rows) == int(SMALL_N) * int(SMALL_R)
    assert metadata["sampling_args"].get("max_tokens") is None  # no -t: the env's default
    env_id = args[1]
    if env_id in SINGLE_TURN:
        default = importlib.import_module(env_id.replace("-", "_")).DEFAULT_SAMPLING_ARGS
        assert max(row["token_usage"]["output_tokens"] for row in rows) <= default["max_tokens"]
