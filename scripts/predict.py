"""Answer rows of an environment's dataset (scored by its rubric) or a JSONL file of prompts.

Thin wrapper: the command is `rlvr.eval.predict.main`, installed as `rlvr-predict`; see --help.
"""

from rlvr.eval.predict import main

if __name__ == "__main__":
    main()
