"""Evaluate models x environment settings x seeds with vf-eval; report with tables and plots.

Thin wrapper: the command is `rlvr.eval.sweep.run.main`, installed as `rlvr-eval-sweep`; see --help.
"""

from rlvr.eval.sweep.run import main

if __name__ == "__main__":
    main()
