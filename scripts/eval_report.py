"""Summarise vf-eval runs (say a base model and a trained checkpoint) in one report.

Thin wrapper: the command is `rlvr.eval.report.main`, installed as `rlvr-eval-report`; see --help.
"""

from rlvr.eval.report import main

if __name__ == "__main__":
    main()
