"""The task list: one row per (case, task id) with its seeded start position as the prompt."""

from __future__ import annotations

from collections.abc import Mapping

import pyspiel
from datasets import Dataset

from .cases import short_name
from .opponents import Opponent
from .prompts import opening_text
from .session import start_session, task_seed


def seat_for(model_player: int | str, task_id: int, num_players: int) -> int:
    """The model's seat: fixed, or rotating with the task id (`alternate`)."""
    return task_id % num_players if model_player == "alternate" else int(model_player)


def build_rows(
    games: Mapping[str, pyspiel.Game],
    opponents: Mapping[str, Opponent],
    num_tasks_per_case: int,
    model_player: int | str,
    max_random_steps: int,
    mode: str,
    seed: int,
) -> list[dict]:
    """Rows ordered task-major (task 0 of every case, then task 1, ...), so the first rows of a
    small evaluation already cover every game."""
    rows = []
    for task_id in range(num_tasks_per_case):
        for case, game in games.items():
            seat = seat_for(model_player, task_id, game.num_players())
            seed_i = task_seed(seed, case, task_id)
            session = start_session(game, case, seat, seed_i, opponents[case], max_random_steps)
            rows.append(
                {
                    "prompt": [{"role": "user", "content": opening_text(case, session, mode)}],
                    "info": {
                        "case": case,
                        "game": short_name(case),
                        "task_id": task_id,
                        "seat": seat,
                        "seed": seed_i,
                        "mode": mode,
                        "opponent": opponents[case].name,
                        "start_actions": list(session.history),
                    },
                }
            )
    return rows


def build_dataset(**kwargs) -> Dataset:
    return Dataset.from_list(build_rows(**kwargs))
