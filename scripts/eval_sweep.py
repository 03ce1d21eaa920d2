"""Evaluate models x environment settings x seeds with vf-eval, then report with tables and plots.

    python scripts/eval_sweep.py ENV --models base=smollm2-135m,trained=outputs/run/final \
        --grid retriever=bm25,hybrid [--seeds 0,1] -n 32 -r 4 [-t 512] --out sweeps/NAME \
        [--env-args JSON] [--sampling-args JSON] [--server-args "--dtype float32 ..."]
    python scripts/eval_sweep.py --report-only --out sweeps/NAME [--threshold 1.0]

Each model is served by its own vf-vllm in turn (adapter directories with vLLM's LoRA
support), or by the server at --base-url. Cells are saved under OUT/cells/ as they finish;
running the same command again runs only the missing ones. The report goes to OUT/report.md
(one table per metric), OUT/report.json and OUT/plots/*.png.
"""

import argparse
import shlex
import sys
from pathlib import Path

from rlvr.config.cli import json_object
from rlvr.eval.sweep.inputs import Shared, SweepError, parse_grid, parse_models, parse_seeds, plan
from rlvr.eval.sweep.report import write_report
from rlvr.eval.sweep.run import load_sweep, run_sweep
from rlvr.eval.vf_eval import ResultsError


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env", nargs="?", help="environment id, e.g. vf-musique")
    parser.add_argument("--out", type=Path, required=True, help="sweep directory")
    parser.add_argument(
        "--models", help="comma-separated models, each MODEL or LABEL=MODEL (name, dir, "
        "hub id or adapter dir; with --base-url, the name the server serves)",
    )  # fmt: skip
    parser.add_argument(
        "--grid", action="append", default=[], metavar="KEY=V1,V2",
        help="an environment argument to sweep (repeat for more axes: every combination)",
    )  # fmt: skip
    parser.add_argument("--seeds", help="environment seeds, e.g. 0,1,2 or 0-4")
    parser.add_argument("--seed-arg", default="seed", help="env argument the seed sets")
    parser.add_argument("--env-args", type=json_object, default={}, help="args for every cell")
    parser.add_argument("-n", "--num-examples", type=int, default=16)
    parser.add_argument("-r", "--rollouts-per-example", type=int, default=4)
    parser.add_argument("-t", "--max-tokens", type=int, default=None)
    parser.add_argument(
        "-S", "--sampling-args", type=json_object, default={},
        help='sampling arguments for every request, e.g. \'{"temperature": 0.7}\'',
    )  # fmt: skip
    parser.add_argument("--base-url", help="use this running server instead of starting one")
    parser.add_argument(
        "--server-args", default="", help="extra vf-vllm flags for the servers the sweep starts"
    )
    parser.add_argument("--cell-timeout", type=float, default=None, help="seconds per cell")
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


if __name__ == "__main__":
    main()
