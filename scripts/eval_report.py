"""Summarise vf-eval runs (say a base model and a trained checkpoint) in one report.

    python scripts/eval_report.py RUN_DIR [RUN_DIR ...] [--names base,trained] [--threshold 1.0]
        [--out report.md] [--json report.json] [--export-sft data.jsonl --min-reward 1.0]

A RUN_DIR is the directory `vf-eval ENV ... -s -o RUN_DIR` saved into. The first run is the
baseline that later runs are compared with, example by example. The Markdown report goes to
stdout (and --out); --json writes the same numbers.
"""

import argparse
import sys
from pathlib import Path

from rlvr.atomic import atomic_write_text
from rlvr.eval.report import build_report, export_chat_jsonl, render_markdown, report_json
from rlvr.eval.vf_eval import ResultsError, load_run


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="vf-eval -o directories")
    parser.add_argument("--names", help="comma-separated run names (default: the RUN_DIRs)")
    parser.add_argument(
        "--threshold", type=float, default=1.0,
        help="a rollout succeeds for pass@k when reward >= this (default 1.0)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write the report's numbers as JSON here")
    parser.add_argument(
        "--export-sft", type=Path, metavar="FILE",
        help="write rollouts with reward >= --min-reward (errored ones skipped) as chat JSONL",
    )  # fmt: skip
    parser.add_argument(
        "--min-reward", type=float, help="reward bar of --export-sft (default: --threshold)"
    )
    args = parser.parse_args()
    args.names = args.names.split(",") if args.names else args.run_dirs
    if len(args.names) != len(args.run_dirs):
        parser.error(f"--names has {len(args.names)} names for {len(args.run_dirs)} RUN_DIRs")
    if len(set(args.names)) != len(args.names):
        parser.error("run names must differ")
    if args.min_reward is not None and args.export_sft is None:
        parser.error("--min-reward goes with --export-sft")
    return args


def main() -> None:
    args = parse_args()
    try:
        runs = [
            load_run(run_dir, name) for run_dir, name in zip(args.run_dirs, args.names, strict=True)
        ]
        report = build_report(runs, args.threshold)
        markdown = render_markdown(report)
        if args.out:
            atomic_write_text(args.out, markdown)
        if args.json:
            atomic_write_text(args.json, report_json(report))
        if args.export_sft:
            bar = args.threshold if args.min_reward is None else args.min_reward
            kept, total = export_chat_jsonl(runs, args.export_sft, bar)
    except (ResultsError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    print(markdown, end="")
    if args.export_sft:
        print(
            f"kept {kept} of {total} rollouts (reward >= {bar:g}, errored ones skipped) "
            f"in {args.export_sft}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
