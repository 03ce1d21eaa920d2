"""Which games the environment serves: default cases, case building, filtering and validation.

A *case* is one `pyspiel.load_game` string (game + parameters). Parameter names below are the
ones open_spiel 2.0.2 accepts (checked with `pyspiel.load_game(name).get_parameters()`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyspiel

DEFAULT_CASES: tuple[str, ...] = (
    "hex(board_size=5)",
    "hex(board_size=7)",
    "hex(board_size=9)",
    "go(board_size=9)",
    "go(board_size=13)",
    "breakthrough(rows=6,columns=6)",
    "breakthrough(rows=8,columns=8)",
    "dots_and_boxes(num_rows=3,num_cols=3)",
    "dots_and_boxes(num_rows=4,num_cols=4)",
    "dots_and_boxes(num_rows=5,num_cols=5)",
    "clobber(rows=5,columns=5)",
    "clobber(rows=6,columns=6)",
    "clobber(rows=7,columns=7)",
    "othello",
    "chess",
    "checkers",
    "tic_tac_toe",
    "connect_four",
    "kuhn_poker",
    "leduc_poker",
    "liars_dice",
)

GameConfig = Mapping[str, Any] | str | None


def short_name(case: str) -> str:
    """The game's registered short name (`hex` for `hex(board_size=5)`), used by `game_types`."""
    return case.split("(", 1)[0].strip()


def _format_value(value: Any) -> str:
    """Writes one parameter the way pyspiel's load-string parser reads it back."""
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def case_string(game: str, config: GameConfig) -> str:
    """One load string from a game name and a parameter dict (or a ready `(k=v,...)` string)."""
    if config is None or (isinstance(config, Mapping) and not config):
        return game
    if isinstance(config, str):
        params = config.strip().strip("()")
        return f"{game}({params})" if params else game
    params = ",".join(f"{key}={_format_value(value)}" for key, value in config.items())
    return f"{game}({params})"


def cases_from_configs(
    game_list: Sequence[str], game_configs: Sequence[GameConfig | Sequence[GameConfig]] | None
) -> list[str]:
    """One case per (game, config) pair; a list of configs for one game gives one case each."""
    if game_configs is None:
        return list(game_list)
    if len(game_configs) != len(game_list):
        raise ValueError(
            f"game_configs has {len(game_configs)} entries but game_list has {len(game_list)}; "
            "give one config (or one list of configs) per game"
        )
    cases: list[str] = []
    for game, config in zip(game_list, game_configs, strict=True):
        configs = config if isinstance(config, list | tuple) else [config]
        cases.extend(case_string(game, one) for one in configs)
    return cases


def split_top_level(text: str) -> list[str]:
    """Splits `hex,go(board_size=9,komi=6.5)` at commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _as_list(value: str | Iterable[str] | None) -> list[str]:
    """Accepts a list or a comma-separated string (the form shell scripts pass)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = split_top_level(value)
    return [item.strip() for item in value if item and item.strip()]


def _compact(case: str) -> str:
    return "".join(case.split())


def filter_cases(cases: Sequence[str], game_types: str | Iterable[str] | None) -> list[str]:
    """Keeps cases whose short name or full string is listed; an unmatched entry is an error."""
    wanted = _as_list(game_types)
    if not wanted:
        return list(cases)
    kept = [
        c for c in cases if any(w in (short_name(c), _compact(c)) for w in map(_compact, wanted))
    ]
    unmatched = [
        w for w in wanted if not any(_compact(w) in (short_name(c), _compact(c)) for c in cases)
    ]
    if unmatched:
        known = sorted({short_name(c) for c in cases})
        raise ValueError(f"game_types {unmatched} match no case; known games: {known}")
    return kept


def resolve_cases(
    cases: str | Sequence[str] | None,
    game_list: str | Sequence[str] | None,
    game_configs: Sequence[GameConfig | Sequence[GameConfig]] | None,
    game_types: str | Iterable[str] | None,
) -> list[str]:
    """The final case list: explicit cases, else game_list+game_configs, else the defaults."""
    if cases is not None and game_list is not None:
        raise ValueError("pass either cases or game_list (+ game_configs), not both")
    if cases is not None:
        chosen = _as_list(cases)
    elif game_list is not None:
        chosen = cases_from_configs(_as_list(game_list), game_configs)
    else:
        chosen = list(DEFAULT_CASES)
    chosen = filter_cases(chosen, game_types)
    if not chosen:
        raise ValueError("no cases selected")
    return list(dict.fromkeys(chosen))


def load_case(case: str) -> pyspiel.Game:
    """Loads and checks one case; refuses games this environment cannot play fairly."""
    try:
        game = pyspiel.load_game(case)
    except pyspiel.SpielError as err:
        raise ValueError(f"case {case!r} does not load in open_spiel: {err}") from err
    game_type = game.get_type()
    if game_type.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        raise ValueError(
            f"case {case!r} is a simultaneous-move game, which this environment does not play; "
            f"wrap it as 'turn_based_simultaneous_game(game={case})' to play it turn by turn"
        )
    if game_type.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ValueError(f"case {case!r} has {game_type.dynamics} dynamics; only sequential games")
    imperfect = game_type.information != pyspiel.GameType.Information.PERFECT_INFORMATION
    if imperfect and not (
        game_type.provides_information_state_string or game_type.provides_observation_string
    ):
        raise ValueError(
            f"case {case!r} hides information but provides no per-player view string, so the "
            "model could only be shown the full (secret-revealing) state"
        )
    return game
