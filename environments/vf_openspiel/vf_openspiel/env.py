"""The multi-turn environment: one model reply per turn, the environment plays everything else.

Rollout state keys:
- `openspiel_session`: the live `GameSession` (pyspiel objects). It never leaves the process and is
  dropped at cleanup, so saved state columns stay JSON-serializable.
- `openspiel`: a small JSON record (counters, illegal replies by the rule they broke, how the game
  ended, returns, action history) that the rubric scores and `vf-eval -C openspiel` can save.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pyspiel
import verifiers as vf

from .opponents import Opponent
from .parser import HEDGE, NO_ANSWER, MoveParser, read_move
from .prompts import illegal_text, turn_text
from .sampling import DefaultSampling
from .session import GameSession, verdict

SESSION_KEY = "openspiel_session"
RECORD_KEY = "openspiel"
ILLEGAL_RULES = {NO_ANSWER: "no final answer", HEDGE: "several moves"}
"""The rule that made a reply illegal, as counted in the record: no delimited final answer,
tags naming different moves, or (any other reason) a final move that is not legal."""


def new_record(info: Mapping[str, Any], game: pyspiel.Game) -> dict[str, Any]:
    """The JSON record of one rollout, filled in as the game goes."""
    return {
        "case": info["case"],
        "task_id": info["task_id"],
        "seat": info["seat"],
        "num_players": game.num_players(),
        "min_utility": game.min_utility(),
        "max_utility": game.max_utility(),
        "replies": 0,
        "legal_replies": 0,
        "illegal_attempts": 0,
        "illegal_by_rule": {},
        "model_moves": 0,
        "ended_by": None,
        "returns": None,
        "game_length": None,
        "history": None,
    }


class OpenSpielEnv(DefaultSampling, vf.MultiTurnEnv):
    """The model holds one seat of an OpenSpiel game; chance and the opponent hold the rest."""

    def __init__(
        self,
        games: Mapping[str, pyspiel.Game],
        opponents: Mapping[str, Opponent],
        mode: str,
        max_illegal_moves: int,
        max_moves: int,
        playouts: int = 1,
        **kwargs: Any,
    ):
        # verifiers counts replies; a game needs at most max_moves legal replies plus the illegal
        # ones it tolerates plus the one that forfeits. Our own limit (on moves) fires first.
        super().__init__(max_turns=max_moves + max_illegal_moves + 1, **kwargs)
        self.games = dict(games)
        self.opponents = dict(opponents)
        self.mode = mode
        self.max_illegal_moves = max_illegal_moves
        self.max_moves = max_moves
        self.playouts = playouts

    async def setup_state(self, state: vf.State) -> None:
        info = state["info"]
        case = info["case"]
        if case not in self.games:
            raise vf.Error(f"task case {case!r} is not one of this environment's cases")
        game = self.games[case]
        session = GameSession(
            game, info["seat"], info["seed"], self.opponents[case], info["start_actions"]
        )
        if session.is_terminal or session.state.current_player() != session.seat:
            raise vf.Error(f"task {info['task_id']} of {case!r} does not start at the model's turn")
        state[SESSION_KEY] = session
        state[RECORD_KEY] = new_record(info, game)

    async def _run(self, session: GameSession, step: Callable[[], Any]) -> Any:
        """Runs a game step; MCTS searches go to a worker thread (pyspiel releases the GIL)."""
        if session.opponent.slow:
            return await asyncio.to_thread(step)
        return step()

    def _finish(self, state: vf.State, ended_by: str, text: str) -> vf.Messages:
        state[RECORD_KEY]["ended_by"] = ended_by
        messages: vf.Messages = [vf.UserMessage(content=text)]
        state["final_env_response"] = messages
        return messages

    def _result_text(self, state: vf.State) -> str:
        session: GameSession = state[SESSION_KEY]
        game, returns = session.game, state[RECORD_KEY]["returns"] or session.returns()
        result = verdict(returns, session.seat, game.min_utility(), game.max_utility())
        past = {"win": "won", "loss": "lost", "draw": "drew"}[result]
        if self.playouts > 1:
            return (
                f"Scored by {self.playouts} playouts: on average you {past} (your mean return "
                f"{returns[session.seat]:g}, all {returns})."
            )
        return f"Game over: you {past} (your return {returns[session.seat]:g}, all {returns})."

    async def env_response(
        self, messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> vf.Messages:
        session: GameSession = state[SESSION_KEY]
        record = state[RECORD_KEY]
        parser: MoveParser = self.parser
        record["replies"] += 1
        moves = parser.parse_moves(messages[-1:])  # the reply just made
        action, reason = read_move(moves, session.lookup())
        if action is None:
            record["illegal_attempts"] += 1
            rule = ILLEGAL_RULES.get(reason, "not legal")
            record["illegal_by_rule"][rule] = record["illegal_by_rule"].get(rule, 0) + 1
            left = self.max_illegal_moves + 1 - record["illegal_attempts"]
            if left <= 0:
                return self._finish(state, "forfeit", "Too many illegal moves: you lose the game.")
            return [vf.UserMessage(content=illegal_text(reason, left, session))]
        record["legal_replies"] += 1
        record["model_moves"] += 1
        played = next(text for legal, text in session.legal_moves() if legal == action)
        if self.mode == "move":
            session.apply(action)
            record["returns"] = await self._run(
                session, lambda: session.playout_returns(self.playouts)
            )
            return self._finish(
                state, "game_over", f"You played {played}. {self._result_text(state)}"
            )
        events = await self._run(session, lambda: session.play(action))
        if session.is_terminal:
            lines = [f"You played {played}.", *events, self._result_text(state)]
            return self._finish(state, "game_over", "\n".join(lines))
        if record["model_moves"] >= self.max_moves:
            return self._finish(
                state,
                "turn_limit",
                f"You played {played}. Turn limit of {self.max_moves} moves reached: the game "
                "stops unfinished.",
            )
        return [vf.UserMessage(content=turn_text(played, events, session))]

    @vf.cleanup
    async def close_game(self, state: vf.State) -> None:
        """Copies the final game facts into the JSON record and drops the pyspiel objects."""
        session: GameSession | None = state.pop(SESSION_KEY, None)
        record = state.get(RECORD_KEY)
        if session is None or record is None:
            return
        if record["ended_by"] is None:
            # Stopped by verifiers (error, prompt too long, token budget, timeout): scored as a loss
            # so that running out of context is never better than losing on the board.
            record["ended_by"] = "aborted"
        if record["returns"] is None:  # move mode scored its playouts already
            record["returns"] = session.returns()
        record["game_length"] = session.player_moves()
        record["history"] = list(session.history)
