"""Demonstrations from any environment: play its rows with a policy (a Python callable or a
served model), keep the rollouts that pass a filter, write them as SFT chat rows.

    python scripts/demonstrations.py --env vf-openspiel --env-args '{"cases": "tic_tac_toe"}' \
        --policy vf_openspiel.scripted:quiet_mover --min-reward 1 --out demos.jsonl

Thin wrapper: the command is `rlvr.eval.demonstrations.main`, installed as `rlvr-demos`; see
--help.
"""

from rlvr.eval.demonstrations import main

if __name__ == "__main__":
    main()
