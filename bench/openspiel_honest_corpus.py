"""vf_openspiel's honest corpus: every honest move style and every exploit of
`vf_openspiel.corpus`, played through the environment's own rollout loop and rubric with a
scripted client, in both reward modes.

Run: .venv/bin/python bench/openspiel_honest_corpus.py   (about a minute; no server needed)

Prints the honest mean and each style's mean, each illegality rule's false-negative rate (the
share of honest replies it made illegal, and the share of honest games forfeited) and each
exploit's mean, per reward mode; saves them to bench/results/openspiel_honest_corpus.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

from vf_openspiel import load_environment
from vf_openspiel.corpus import EXPLOITS, false_negative_rates, honest_policies, means, play

from rlvr.scripted import ScriptedClient

RESULTS = Path(__file__).with_name("results") / "openspiel_honest_corpus.json"
SETTINGS = {
    # every default case, 2 tasks each, 10 model moves per game: legality on every game
    "legal": {"reward_mode": "legal", "num_tasks_per_case": 2, "max_turns": 10},
    # whole games where they are short, so the outcome is the game's result
    "outcome": {
        "reward_mode": "outcome",
        "num_tasks_per_case": 4,
        "cases": ["tic_tac_toe", "connect_four", "kuhn_poker", "leduc_poker", "liars_dice"],
    },
}


def measure(kwargs: dict) -> dict:
    env = load_environment(**kwargs)
    honest = asyncio.run(play(env, honest_policies(), ScriptedClient))
    exploits = asyncio.run(play(env, EXPLOITS, ScriptedClient))
    return {
        "games": len(honest),
        "cases": len({g.case for g in honest}),
        "honest_mean": statistics.mean(g.reward for g in honest),
        "styles": means(honest),
        "false_negative_rates": false_negative_rates(honest),
        "exploits": means(exploits),
    }


def main() -> None:
    results = {mode: measure(kwargs) for mode, kwargs in SETTINGS.items()}
    for mode, result in results.items():
        print(f"reward_mode={mode}: {result['games']} honest games on {result['cases']} cases")
        print(f"  honest mean {result['honest_mean']:.3f}")
        for name, mean in result["styles"].items():
            print(f"    {name:36} {mean:.3f}")
        print("  false-negative rate per rule (share of honest replies made illegal):")
        for rule, rate in result["false_negative_rates"].items():
            print(f"    {rule:36} {rate:.3f}")
        print("  exploit means:")
        for name, mean in result["exploits"].items():
            print(f"    {name:36} {mean:.3f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
