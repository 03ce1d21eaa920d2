"""The four environment packages as vf-eval and pip see them: each one's `[tool.verifiers.eval]`
defaults are read by vf-eval's own code when `-n` / `-r` are left out, from an editable checkout
and from a regular wheel install alike, and the helpers shared through environments/shared/ arrive
in the wheel as real files.

vf-eval 0.1.14 reads the table from `pyproject.toml` in the directory of the module it imports
(`verifiers.scripts.eval.get_env_eval_defaults`), i.e. `vf_<name>/vf_<name>/pyproject.toml`, not
the package root's. The end-to-end runs against a served model are in the *_integration files.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from verifiers.scripts import eval as vf_eval_cli

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENTS = ["vf-deepscaler", "vf-musique", "vf-openspiel", "vf-planner"]
SHARED = {
    "replies.py": ENVIRONMENTS,
    "sampling.py": ENVIRONMENTS,
    "outcome_rubric.py": ENVIRONMENTS,
    "hub.py": ["vf-deepscaler", "vf-musique"],
}


def module_of(env_id: str) -> str:
    return env_id.replace("-", "_")


def table(env_id: str) -> dict[str, int]:
    """The [tool.verifiers.eval] table beside the module, as this checkout has it."""
    module = module_of(env_id)
    path = ROOT / "environments" / module / module / "pyproject.toml"
    return tomllib.loads(path.read_text())["tool"]["verifiers"]["eval"]


@pytest.mark.parametrize("env_id", ENVIRONMENTS)
def test_vf_eval_without_n_or_r_uses_the_environments_table(env_id, monkeypatch):
    """vf-eval's entry point (`verifiers.scripts.eval:main`, what the `vf-eval` command runs) with
    no -n / -r: the evaluation it would start asks for the table's numbers. Only the final
    `run_evaluations` call is replaced, to capture its config instead of calling a model."""
    expected = table(env_id)
    assert (expected["num_examples"], expected["rollouts_per_example"]) != (
        vf_eval_cli.DEFAULT_NUM_EXAMPLES,
        vf_eval_cli.DEFAULT_ROLLOUTS_PER_EXAMPLE,
    )  # else this test could not tell the table from vf-eval's own defaults
    assert Path(importlib.import_module(module_of(env_id)).__file__).is_relative_to(ROOT)
    captured = []

    async def capture(run_config):
        captured.append(run_config)

    monkeypatch.setattr(vf_eval_cli, "run_evaluations", capture)
    monkeypatch.setenv("EVAL_KEY", "EMPTY")
    vf_eval_cli.main([env_id, "-m", "m", "-b", "http://127.0.0.1:9/v1", "-k", "EVAL_KEY", "-d"])
    [config] = captured[0].evals
    assert config.num_examples == expected["num_examples"]
    assert config.rollouts_per_example == expected["rollouts_per_example"]


def test_openspiel_default_covers_every_default_case():
    from vf_openspiel import DEFAULT_CASES

    assert table("vf-openspiel")["num_examples"] == len(DEFAULT_CASES)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """Each environment built as a regular wheel (no editable install, no build isolation), from
    a copy of environments/ (links kept as links), so no stale build/ folder can hide a file
    missing from the package data and the checkout stays clean."""
    source = tmp_path_factory.mktemp("source") / "environments"
    junk = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT / "environments", source, symlinks=True, ignore=junk)
    out = tmp_path_factory.mktemp("wheels")
    dirs = [str(source / module_of(env_id)) for env_id in ENVIRONMENTS]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            *dirs,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ENVIRONMENTS)
def test_wheel_install_ships_the_table_and_the_shared_modules(env_id, wheels, tmp_path):
    """Installed from its wheel into a fresh directory, the package has the table where vf-eval
    reads it (vf-eval's own lookup finds it there), and the shared modules as regular files with
    the shared content."""
    module = module_of(env_id)
    [wheel] = wheels.glob(f"{module}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name, owners in SHARED.items():
            if env_id in owners:
                shipped = archive.read(f"{module}/{name}").decode()
                assert shipped == (ROOT / "environments" / "shared" / name).read_text()
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    probe = (
        "import json, importlib.util; from verifiers.scripts.eval import get_env_eval_defaults; "
        f"spec = importlib.util.find_spec({module!r}); "
        f"print(json.dumps([spec.origin, get_env_eval_defaults({env_id!r})]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}  # this wheel, not the checkout
    proc = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    origin, defaults = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(origin).is_relative_to(site)
    assert defaults == table(env_id)


def test_each_package_links_the_one_shared_copy():
    """One source for each shared helper: every package holds a symlink to it, not a copy."""
    for name, owners in SHARED.items():
        for env_id in owners:
            module = module_of(env_id)
            link = ROOT / "environments" / module / module / name
            assert link.is_symlink(), link
            assert link.resolve() == (ROOT / "environments" / "shared" / name).resolve()
