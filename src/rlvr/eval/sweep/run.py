"""Runs a sweep: every missing cell's vf-eval run, renamed into place only once finished.

The spec is recorded first in `OUT/sweep.json`; cells made with other shared settings are
refused."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_directory, atomic_write_text
from rlvr.config.cli import json_object, positive_int
from rlvr.eval.sweep.inputs import (
    CELLS,
    SPEC_FILE,
    Cell,
    ModelEntry,
    Setting,
    Shared,
    Sweep,
    SweepError,
    directory_name,
    is_done,
    parse_grid,
    parse_models,
    parse_seeds,
    plan,
)
from rlvr.eval.sweep.report import write_report
from rlvr.eval.vf_eval import ResultsError, run_vf_eval
from rlvr.server.serve_model import serve


def record_sweep(out: Path, sweep: Sweep) -> Sweep:
    """Record the sweep in OUT/sweep.json and return the union recorded so far: the first run
    fixes the shared settings, later ones may add models, settings or seeds; a label that
    comes back naming another model or other arguments is refused."""
    path = out / SPEC_FILE
    if path.is_file():
        recorded = load_sweep(out)
        old, new = asdict(recorded.shared), asdict(sweep.shared)
        changed = [k for k in new if old.get(k) != new[k]]
        if changed:
            details = "; ".join(f"{k}: was {old.get(k)!r}, now {new[k]!r}" for k in changed)
            raise SweepError(
                f"{out} holds a sweep run with other shared settings ({details}); "
                "use another --out or the same settings"
            )
        sweep = Sweep(
            sweep.shared,
            _union("model", recorded.models, sweep.models),
            _union("setting", recorded.settings, sweep.settings),
            list(dict.fromkeys([*recorded.seeds, *sweep.seeds])),
        )
    spec = {
        "shared": asdict(sweep.shared),
        "models": [asdict(m) for m in sweep.models],
        "settings": [asdict(s) for s in sweep.settings],
        "seeds": sweep.seeds,
    }
    atomic_write_text(path, json.dumps(spec, indent=2) + "\n")
    return sweep


def _union(kind: str, old: list[Any], new: list[Any]) -> list[Any]:
    """`old` then the entries of `new` it lacks, matched by label."""
    merged = {entry.label: entry for entry in old}
    for entry in new:
        if merged.setdefault(entry.label, entry) != entry:
            raise SweepError(
                f"{kind} label {entry.label!r} was {merged[entry.label]}, now {entry}; "
                "give it another label"
            )
    return list(merged.values())


def load_sweep(out: Path) -> Sweep:
    """The sweep recorded in `out` (every model, setting and seed run into it)."""
    path = out / SPEC_FILE
    if not path.is_file():
        raise SweepError(f"{out} holds no sweep ({SPEC_FILE} not found)")
    spec = json.loads(path.read_text())
    return Sweep(
        Shared(**spec["shared"]),
        [ModelEntry(**m) for m in spec["models"]],
        [Setting(**s) for s in spec["settings"]],
        spec["seeds"],
    )


@dataclass
class SweepRun:
    """What running a sweep did: cells run now, cells finished before, cells that failed."""

    ran: list[Cell] = field(default_factory=list)
    skipped: list[Cell] = field(default_factory=list)
    failed: list[tuple[Cell, str]] = field(default_factory=list)


def run_sweep(
    sweep: Sweep,
    out: Path,
    *,
    base_url: str | None = None,
    server_args: Sequence[str] = (),
    cell_timeout: float | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> SweepRun:
    """Run every unfinished cell, one model (and its own vf-vllm, unless `base_url`) at a
    time, `jobs` of its cells at once (the server batches their requests: one vf-eval seldom
    fills it); a failing cell, or a model whose server does not start, is recorded and the
    sweep goes on."""
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    record_sweep(out, sweep)
    for stale in (out / CELLS).rglob(".tmp-*") if (out / CELLS).is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)  # an interrupted cell's partial output
    result = SweepRun()
    cells = sweep.cells
    result.skipped = [c for c in cells if is_done(c.directory(out))]
    bar = tqdm(
        total=len(cells),
        initial=len(result.skipped),
        desc="sweep",
        unit="cell",
        disable=not progress,
    )
    for model in sweep.models:
        pending = [c for c in cells if c.model == model and c not in result.skipped]
        if not pending:
            continue
        log = out / CELLS / directory_name(model.label) / "vf-vllm.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            try:
                endpoint = stack.enter_context(
                    serve(
                        model.model,
                        name=model.label if base_url is None else None,
                        base_url=base_url,
                        server_args=server_args,
                        log_path=log,
                    )
                )
            except (RuntimeError, TimeoutError, OSError, ValueError) as e:
                result.failed += [
                    (c, f"server for {model.label} did not start: {e}") for c in pending
                ]
                bar.update(len(pending))
                continue
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                running = [
                    pool.submit(
                        _run_cell, sweep, cell, out, endpoint.base_url, endpoint.model, cell_timeout
                    )
                    for cell in pending
                ]
                for cell, future in zip(pending, running, strict=True):
                    try:
                        future.result()
                        result.ran.append(cell)
                    except Exception as e:  # recorded and reported; the sweep goes on
                        result.failed.append((cell, f"{type(e).__name__}: {e}"))
                    bar.set_postfix_str(cell.label)
                    bar.update(1)
    bar.close()
    return result


def _run_cell(
    sweep: Sweep, cell: Cell, out: Path, base_url: str, model: str, timeout: float | None
) -> None:
    """One vf-eval run, saved in a hidden directory that becomes the cell's once complete."""
    shared = sweep.shared
    env_args = sweep.env_args(cell)
    with atomic_directory(cell.directory(out)) as tmp:
        run_vf_eval(
            shared.env_id,
            model=model,
            base_url=base_url,
            output_dir=tmp,
            num_examples=shared.num_examples,
            rollouts_per_example=shared.rollouts_per_example,
            max_tokens=shared.max_tokens,
            env_args=env_args,
            sampling_args=shared.sampling_args or None,
            timeout=timeout,
        )
        record = {**asdict(cell), "served_model": model, "env_args": env_args}
        atomic_write_text(tmp / "cell.json", json.dumps(record, indent=2) + "\n")


# ---- the command ---------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("env", nargs="?", help="environment id, e.g. vf-musique")
    parser.add_argument("--out", type=Path, required=True, help="sweep directory")
    parser.add_argument(
        "--models",
        help="comma-separated models, each MODEL or LABEL=MODEL (name, dir, "
        "hub id or adapter dir; with --base-url, the name the server serves)",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="an environment argument to sweep (repeat for more axes: every combination)",
    )
    parser.add_argument("--seeds", help="environment seeds, e.g. 0,1,2 or 0-4")
    parser.add_argument("--seed-arg", default="seed", help="env argument the seed sets")
    parser.add_argument("--env-args", type=json_object, default={}, help="args for every cell")
    parser.add_argument("-n", "--num-examples", type=int, default=16)
    parser.add_argument("-r", "--rollouts-per-example", type=int, default=4)
    parser.add_argument("-t", "--max-tokens", type=int, default=None)
    parser.add_argument(
        "-S",
        "--sampling-args",
        type=json_object,
        default={},
        help="sampling arguments for every request, e.g. '{\"temperature\": 0.7}'",
    )
    parser.add_argument("--base-url", help="use this running server instead of starting one")
    parser.add_argument(
        "--server-args", default="", help="extra vf-vllm flags for the servers the sweep starts"
    )
    parser.add_argument("--cell-timeout", type=float, default=None, help="seconds per cell")
    parser.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="cells run at once against each model's server (it batches their requests)",
    )
    parser.add_argument("--threshold", type=float, default=1.0, help="pass@k success bar")
    parser.add_argument(
        "--report-only", action="store_true", help="report on the finished cells of --out"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args()
    if not args.report_only and not (args.env and args.models):
        parser.error("give ENV and --models (or --report-only)")
    return args


def main() -> None:
    """Evaluate models x environment settings x seeds with vf-eval; report with tables and plots.

        python scripts/eval_sweep.py ENV --models base=smollm2-135m,trained=outputs/run/final \
            --grid retriever=bm25,hybrid [--seeds 0,1] -n 32 -r 4 [-t 512] --out sweeps/NAME \
            [--env-args JSON] [--sampling-args JSON] [--server-args "--dtype float32 ..."] \
            [--jobs 4]
        python scripts/eval_sweep.py --report-only --out sweeps/NAME [--threshold 1.0]

    Installed as `rlvr-eval-sweep`; how it runs: docs/evaluation.md#evaluation-sweeps.
    """
    args = parse_args()
    try:
        if not args.report_only:
            shared = Shared(
                env_id=args.env,
                num_examples=args.num_examples,
                rollouts_per_example=args.rollouts_per_example,
                max_tokens=args.max_tokens,
                sampling_args=args.sampling_args,
                base_env_args=args.env_args,
                seed_arg=args.seed_arg,
            )
            models, settings = parse_models(args.models), parse_grid(args.grid)
            sweep = plan(shared, models, settings, parse_seeds(args.seeds))
            result = run_sweep(
                sweep,
                args.out,
                base_url=args.base_url,
                server_args=shlex.split(args.server_args),
                cell_timeout=args.cell_timeout,
                progress=not args.no_progress,
                jobs=args.jobs,
            )
            print(
                f"{len(result.ran)} cells run, {len(result.skipped)} already done, "
                f"{len(result.failed)} failed",
                file=sys.stderr,
            )
            for cell, reason in result.failed:
                print(f"FAILED {cell.label}: {reason}", file=sys.stderr)
        report = write_report(load_sweep(args.out), args.out, args.threshold)
    except (SweepError, ResultsError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    print(report.read_text(), end="")
    print(f"report: {report} (plots in {args.out / 'plots'})", file=sys.stderr)
    if not args.report_only and result.failed:
        raise SystemExit(1)
