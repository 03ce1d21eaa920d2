"""vf-openspiel: the model plays OpenSpiel games turn by turn against a random or MCTS opponent."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .cases import DEFAULT_CASES, load_case, resolve_cases, short_name
from .dataset import build_dataset, seat_for
from .env import RECORD_KEY, SESSION_KEY, OpenSpielEnv
from .opponents import make_opponent
from .parser import MoveParser, extract_move, extract_moves, match_move, read_move
from .prompts import SYSTEM_PROMPT
from .rubric import OpenSpielRubric

MODES = ("game", "move")
# Reply budget per turn (bench/reply_lengths.py, embedded model's tokenizer): the longest legal
# move in its tag takes at most 16 tokens; the rest leaves room for a few sentences of reasoning
# before it. A game asks for a reply every turn, so a larger budget multiplies: with 256, vf-eval's
# default 21 games took over 7 minutes on 2 shared cores. `vf-eval -t` or the trainer's
# sampling.max_tokens override it.
DEFAULT_SAMPLING_ARGS = {"max_tokens": 128}
REWARD_MODES = ("outcome", "legal")


def load_environment(
    cases: str | Sequence[str] | None = None,
    game_list: str | Sequence[str] | None = None,
    game_configs: Sequence[Any] | None = None,
    game_types: str | Sequence[str] | None = None,
    num_tasks_per_case: int = 100,
    max_random_steps: int = 4,
    mode: str = "game",
    playouts: int = 1,
    reward_mode: str = "outcome",
    opponent: str = "random",
    mcts_simulations: int = 100,
    model_player: int | str = "alternate",
    max_illegal_moves: int = 2,
    max_turns: int = 200,
    truncation_reward: float = 0.0,
    seed: int = 0,
    system_prompt: str = SYSTEM_PROMPT,
) -> OpenSpielEnv:
    """Builds the environment (README.md documents every argument).

    Games load and are checked here, so a bad case fails at once with its name; the task rows
    (seeded start positions) are built on first use.
    """
    _check_choice("mode", mode, MODES)
    _check_choice("reward_mode", reward_mode, REWARD_MODES)
    _check_at_least("num_tasks_per_case", num_tasks_per_case, 1)
    _check_at_least("playouts", playouts, 1)
    if playouts > 1 and mode != "move":
        raise ValueError(f"playouts={playouts} scores a single move: it needs mode='move'")
    _check_at_least("max_random_steps", max_random_steps, 0)
    _check_at_least("max_illegal_moves", max_illegal_moves, 0)
    _check_at_least("max_turns", max_turns, 1)
    _check_unit_interval("truncation_reward", truncation_reward)
    player = _model_player(model_player)
    case_list = resolve_cases(cases, game_list, game_configs, game_types)
    games = {case: load_case(case) for case in case_list}
    for case, game in games.items():
        if player != "alternate" and int(player) >= game.num_players():
            raise ValueError(
                f"model_player={player} but case {case!r} has {game.num_players()} players"
            )
    opponents = {
        case: make_opponent(opponent, game, mcts_simulations) for case, game in games.items()
    }
    rows = functools.cache(
        functools.partial(
            build_dataset,
            games=games,
            opponents=opponents,
            num_tasks_per_case=num_tasks_per_case,
            model_player=player,
            max_random_steps=max_random_steps,
            mode=mode,
            seed=seed,
        )
    )
    parser = MoveParser()
    return OpenSpielEnv(
        games=games,
        opponents=opponents,
        mode=mode,
        max_illegal_moves=max_illegal_moves,
        max_moves=1 if mode == "move" else max_turns,
        playouts=playouts,
        dataset=rows,
        eval_dataset=rows,
        system_prompt=system_prompt,
        parser=parser,
        rubric=OpenSpielRubric(reward_mode, parser, float(truncation_reward)),
        sampling_args=DEFAULT_SAMPLING_ARGS,
    )


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_at_least(name: str, value: int, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_unit_interval(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def _model_player(value: int | str) -> int | str:
    """`alternate` (seat = task id mod players) or a fixed seat number (int or digit string)."""
    if value == "alternate":
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"model_player must be 'alternate' or a seat number >= 0, got {value!r}")


__all__ = [
    "DEFAULT_CASES",
    "DEFAULT_SAMPLING_ARGS",
    "RECORD_KEY",
    "SESSION_KEY",
    "SYSTEM_PROMPT",
    "MoveParser",
    "OpenSpielEnv",
    "OpenSpielRubric",
    "extract_move",
    "extract_moves",
    "load_environment",
    "match_move",
    "read_move",
    "resolve_cases",
    "seat_for",
    "short_name",
]
