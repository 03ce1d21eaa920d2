"""Plot a training run's curves from its metrics.jsonl (works while the run is going).

Thin wrapper: the command is `rlvr.eval.plots.main`, installed as `rlvr-plot-run`; see --help.
"""

from rlvr.eval.plots import main

if __name__ == "__main__":
    main()
