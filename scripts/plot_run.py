"""Plot a training run's curves from its metrics.jsonl (works while the run is going).

    python scripts/plot_run.py outputs/run [--keys reward/mean,mismatch_kl] [--out curves.png]

RUN is the run's output_dir (or its metrics.jsonl). Default keys: reward/mean (with ±1 std and
eval/reward), loss/kl_ref, mismatch_kl, time/step; metrics the run did not log are skipped.
The PNG goes to RUN/curves.png unless --out says otherwise.
"""

import argparse
from pathlib import Path

from rlvr.eval.plots import RUN_CURVE_KEYS, plot_run_curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="run directory or metrics.jsonl")
    parser.add_argument("--keys", default=",".join(RUN_CURVE_KEYS), help="comma-separated")
    parser.add_argument("--out", type=Path, help="PNG path (default RUN/curves.png)")
    parser.add_argument("--title", help="figure title (default: the run directory)")
    args = parser.parse_args()
    metrics = args.run / "metrics.jsonl" if args.run.is_dir() else args.run
    run_dir = metrics.parent
    keys = [key.strip() for key in args.keys.split(",") if key.strip()]
    try:
        out = plot_run_curves(
            metrics, args.out or run_dir / "curves.png", keys, title=args.title or str(run_dir)
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
