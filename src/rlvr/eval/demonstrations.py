"""Demonstrations from any environment (`rlvr-demos`, scripts/demonstrations.py): play its rows
through its own rollout loop with a policy (a Python policy factory `module:function`, or an
OpenAI-compatible model), keep the rollouts that ran without error, reached `--min-reward` and
meet every `--require`, and write them as SFT chat rows through `rlvr.eval.export`.
Design: docs/training.md#demonstrations-for-a-warm-start.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from rlvr.config.cli import json_object, positive_int
from rlvr.eval.export import Requirement, export_rollouts, parse_requirement
from rlvr.eval.predict import environment_rows, generate_saved
from rlvr.scripted import Policy

PolicyFactory = Callable[[int], Policy]
SCRIPTED_MODEL = "scripted"


class PolicyError(ValueError):
    """A `module:function` that does not name a policy factory."""


def load_policy_factory(spec: str) -> PolicyFactory:
    """The callable `spec` names (`package.module:function`), checked to be callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyError(
            f"--policy {spec!r}: expected MODULE:FUNCTION, e.g. vf_openspiel.scripted:random_mover"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise PolicyError(f"--policy {spec!r}: cannot import module {module_name!r} ({e})") from e
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise PolicyError(f"--policy {spec!r}: module {module_name!r} has no {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise PolicyError(f"--policy {spec!r}: {attr!r} is not callable")
    return factory


def scripted_policy(spec: str, seed: int, policy_args: dict[str, Any] | None = None) -> Policy:
    """The policy the factory `spec` makes for `seed` (and the keyword `policy_args`, e.g. the
    data files an oracle demonstrator looks its rows up in), checked to be callable."""
    try:
        policy = load_policy_factory(spec)(seed, **(policy_args or {}))
    except TypeError as e:
        raise PolicyError(f"--policy {spec!r} with --policy-args {policy_args}: {e}") from e
    if not callable(policy):
        raise PolicyError(
            f"--policy {spec!r}: calling it with the seed must return a policy (a function "
            f"of the prompt messages), got {type(policy).__name__}"
        )
    return policy


def play(
    env: Any,
    rows: list[dict[str, Any]],
    *,
    client: Any,
    model: str,
    sampling_args: dict[str, Any] | None = None,
    rollouts_per_example: int = 1,
    max_concurrent: int = -1,
    progress: bool = True,
) -> list[tuple[str, dict[str, Any]]]:
    """Every row played `rollouts_per_example` times through `env.generate` (with verifiers'
    progress bar unless not `progress`), as (where, saved rollout) pairs in example order;
    `where` (`example 3, rollout 2`) names a rollout in errors."""
    inputs = [row for row in rows for _ in range(rollouts_per_example)]
    outputs = generate_saved(
        env,
        inputs,
        client=client,
        model=model,
        sampling_args=sampling_args or {},
        max_concurrent=max_concurrent,
        progress=progress,
    )
    seen: dict[int, int] = {}
    played = []
    for output in outputs:
        example = output["example_id"]
        seen[example] = seen.get(example, 0) + 1
        played.append((f"example {example}, rollout {seen[example]}", output))
    return played


@dataclass(frozen=True)
class Written:
    """What a demonstration run kept."""

    kept: int
    total: int
    mean_reward: float
    path: Path

    def summary(self) -> str:
        return (
            f"kept {self.kept} of {self.total} rollouts (mean reward of all "
            f"{self.mean_reward:.3f}) in {self.path}"
        )


def write_demonstrations(
    played: Sequence[tuple[str, dict[str, Any]]],
    path: str | Path,
    min_reward: float,
    require: Sequence[Requirement] = (),
) -> Written:
    """The rollouts of `play` that pass the filter, as SFT chat rows in `path`."""
    kept, total = export_rollouts(played, path, min_reward, require)
    mean = fmean(float(row.get("reward", 0.0)) for _, row in played) if played else 0.0
    return Written(kept, total, mean, Path(path))


# ---- the command ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="environment id, e.g. vf-openspiel")
    parser.add_argument("--env-args", type=json_object, default={}, help="load_environment args")
    parser.add_argument("--split", choices=["train", "eval"], default="train")
    parser.add_argument("-n", "--num-rows", type=positive_int, help="first N rows (default: all)")
    parser.add_argument("-r", "--rollouts-per-example", type=positive_int, default=1)
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--policy", help="MODULE:FUNCTION, a policy factory (see the module doc)")
    who.add_argument("--model", help="a model name: embedded, directory, hub id or adapter")
    parser.add_argument("--seed", type=int, default=0, help="seed given to the policy factory")
    parser.add_argument(
        "--policy-args", type=json_object, default={}, help="with --policy: its keyword args"
    )
    parser.add_argument("--base-url", help="with --model: a running server serving it")
    parser.add_argument("--server-args", default="", help="with --model: extra vf-vllm flags")
    parser.add_argument("-T", "--temperature", type=float, help="with --model")
    parser.add_argument("-t", "--max-tokens", type=positive_int, help="with --model")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument(
        "-c", "--max-concurrent", type=int, default=32, help="rollouts in flight (-1: all)"
    )
    parser.add_argument("--min-reward", type=float, default=1.0, help="keep reward >= this")
    parser.add_argument(
        "--require",
        type=parse_requirement,
        action="append",
        default=[],
        metavar="METRIC>=VALUE",
        help="keep only rollouts whose metric meets this (repeatable; >=, <=, ==, >, <)",
    )
    parser.add_argument("--out", type=Path, required=True, help="SFT rows: .jsonl or .parquet")
    args = parser.parse_args(argv)
    if args.policy and (args.base_url or args.server_args):
        parser.error("--base-url and --server-args go with --model")
    if args.model and args.policy_args:
        parser.error("--policy-args goes with --policy")
    return args


def run(args: argparse.Namespace) -> Written:
    """Play the environment's rows with the chosen policy or server and write the kept rows."""
    import verifiers as vf

    from rlvr.scripted import ScriptedClient

    policy = scripted_policy(args.policy, args.seed, args.policy_args) if args.policy else None
    env = vf.load_environment(args.env, **args.env_args)
    rows = environment_rows(env, args.num_rows, args.split)
    common = dict(
        rollouts_per_example=args.rollouts_per_example, max_concurrent=args.max_concurrent
    )
    if policy is not None:
        client = ScriptedClient(policy)
        played = play(env, rows, client=client, model=SCRIPTED_MODEL, **common)
    else:
        played = _play_model(env, rows, args, common)
    return write_demonstrations(played, args.out, args.min_reward, args.require)


def _play_model(env: Any, rows: list, args: argparse.Namespace, common: dict) -> list:
    from rlvr.rollouts.client import make_client
    from rlvr.server.serve_model import serve

    sampling = {"temperature": args.temperature, "max_tokens": args.max_tokens}
    sampling = {k: v for k, v in sampling.items() if v is not None}
    log = args.out.with_name(args.out.name + ".vf-vllm.log")
    server_args = shlex.split(args.server_args)
    with serve(args.model, base_url=args.base_url, server_args=server_args, log_path=log) as end:
        connections = args.max_concurrent if args.max_concurrent > 0 else 64
        client = make_client(end.base_url, None, args.timeout, connections, training=False)
        return play(env, rows, client=client, model=end.model, sampling_args=sampling, **common)


def main(argv: Sequence[str] | None = None) -> None:
    """Play an environment's rows with a policy and write the rollouts that pass as SFT rows.

        python scripts/demonstrations.py --env vf-openspiel \\
            --env-args '{"cases": "tic_tac_toe", "num_tasks_per_case": 400}' \\
            --policy vf_openspiel.scripted:quiet_mover --min-reward 1 --out demos.jsonl
        python scripts/demonstrations.py --env vf-deepscaler --model smollm2-135m -r 8 \\
            --base-url http://127.0.0.1:8000/v1 --require correct>=1 --out demos.parquet

    Installed as `rlvr-demos`; the options: docs/training.md#demonstrations-for-a-warm-start.
    """
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        written = run(args)
    except (ValueError, OSError, RuntimeError, TimeoutError) as e:
        raise SystemExit(f"error: {e}") from None
    print(written.summary(), file=sys.stderr)
