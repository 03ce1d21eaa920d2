"""The live game of one task: seeded start states, chance and opponent moves, the model's view.

Determinism: everything random is drawn from `random.Random(rng_seed(task_seed, stream, index))`.
Chance outcomes and opponent choices at ply `p` use stream PLY and index `p`, so they depend only
on the task and the position's ply count, never on how many draws came before (illegal retries,
a rebuilt session, a different process). Python's Mersenne Twister seeded with an int is the same
on every platform and version, and seeding it costs ~10 us, under half of numpy's default_rng.
"""

from __future__ import annotations

import hashlib
import random
import statistics

import pyspiel

from .opponents import CHANCE, Opponent, RandomOpponent, sample_chance

START_STREAM = 0
PLY_STREAM = 1
PLAYOUT_STREAM = 2


def rng_seed(task: int, stream: int, index: int) -> int:
    """One integer per (task seed, stream, index); the bit fields never overlap."""
    return (task << 40) | (stream << 32) | index


def normalized(value: float, low: float, high: float) -> float:
    """A return mapped into [0, 1] with the game's utility range."""
    return min(1.0, max(0.0, (value - low) / (high - low))) if high > low else 0.0


def verdict(returns: list[float], seat: int, low: float, high: float) -> str:
    """win / draw / loss for `seat`: against the best other seat, or (one-player games) against
    the middle of the utility range."""
    others = [value for index, value in enumerate(returns) if index != seat]
    mine, other = (
        (returns[seat], max(others)) if others else (normalized(returns[seat], low, high), 0.5)
    )
    return "win" if mine > other else "loss" if mine < other else "draw"


def task_seed(seed: int, case: str, task_id: int) -> int:
    """A stable 63-bit seed per (base seed, case, task id), the same in every process."""
    digest = hashlib.sha256(f"{seed}|{case}|{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class GameSession:
    """Holds the pyspiel state of one rollout and plays every seat except the model's."""

    def __init__(
        self,
        game: pyspiel.Game,
        seat: int,
        seed: int,
        opponent: Opponent,
        actions: list[int] | tuple[int, ...] = (),
    ):
        self.game = game
        self.seat = seat
        self.seed = seed
        self.opponent = opponent
        game_type = game.get_type()
        self.perfect_info = (
            game_type.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        )
        self._use_observation = game_type.provides_observation_string and (
            self.perfect_info or not game_type.provides_information_state_string
        )
        self.state = game.new_initial_state()
        self.history: list[int] = []
        self._legal: list[tuple[int, str]] | None = None
        self._lookup: dict[str, int] | None = None
        for action in actions:
            self.apply(action)

    # ------------------------------------------------------------------ state changes
    def apply(self, action: int) -> None:
        self.state.apply_action(action)
        self.history.append(action)
        self._legal = None
        self._lookup = None

    def _rng(self) -> random.Random:
        return random.Random(rng_seed(self.seed, PLY_STREAM, len(self.history)))

    def describe(self, player: int, action: int) -> str | None:
        """The line the model sees about a move it did not make; None where it is hidden.

        In imperfect-information games nothing is described: chance outcomes (cards dealt) and
        other players' actions may be secret, and the model's information state already shows
        what it is allowed to know.
        """
        if not self.perfect_info:
            return None
        text = self.state.action_to_string(player, action)
        return f"Chance: {text}" if player == CHANCE else f"Player {player} played {text}"

    def auto_step(self, policy: Opponent) -> str | None:
        """One chance outcome or one `policy` move; returns its description for the model."""
        player = self.state.current_player()
        rng = self._rng()
        if player == CHANCE:
            action = sample_chance(self.state, rng)
        else:
            action = policy.choose(self.state, rng)
        event = self.describe(player, action)
        self.apply(action)
        return event

    def advance(self) -> list[str]:
        """Plays chance and opponent moves until the model must decide or the game is over."""
        events = []
        while not self.state.is_terminal() and self.state.current_player() != self.seat:
            event = self.auto_step(self.opponent)
            if event is not None:
                events.append(event)
        return events

    def play(self, action: int) -> list[str]:
        """Applies the model's (legal) action and answers with the other seats' moves."""
        self.apply(action)
        return self.advance()

    def playout(self) -> None:
        """Finishes the game with the opponent's policy on every seat (move mode's evaluation)."""
        while not self.state.is_terminal():
            self.auto_step(self.opponent)

    def playout_returns(self, playouts: int) -> list[float]:
        """Move mode's score: every seat's mean return over `playouts` games finished from
        here with the opponent's policy on every seat.

        One playout is a single sample of what the move is worth (against a random opponent
        a good move often loses and a blunder often wins), the many average that noise away.
        The first playout finishes this session's own game (its history is the record's); the
        others replay the history into sessions seeded apart (`PLAYOUT_STREAM`), so each draws
        its own moves and all are reproducible.
        """
        games = [self] + [
            GameSession(
                self.game,
                self.seat,
                rng_seed(self.seed, PLAYOUT_STREAM, index),
                self.opponent,
                self.history,
            )
            for index in range(1, playouts)
        ]
        for game in games:
            game.playout()
        return [statistics.fmean(seat) for seat in zip(*(g.returns() for g in games), strict=True)]

    # ------------------------------------------------------------------ what the model sees
    @property
    def is_terminal(self) -> bool:
        return self.state.is_terminal()

    def view(self) -> str:
        """The model's view: observation string in perfect-information games, information-state
        string where information is hidden (falling back to whichever the game provides)."""
        if self._use_observation:
            return self.state.observation_string(self.seat)
        return self.state.information_state_string(self.seat)

    def legal_moves(self) -> list[tuple[int, str]]:
        """(id, text) of each legal move of the model, computed once per decision."""
        if self._legal is None:
            self._legal = [
                (action, self.state.action_to_string(self.seat, action))
                for action in self.state.legal_actions()
            ]
        return self._legal

    def lookup(self) -> dict[str, int]:
        """Exact-match table: move text and decimal id -> action (text wins on a clash)."""
        if self._lookup is None:
            table = {str(action): action for action, _ in self.legal_moves()}
            table.update({text: action for action, text in self.legal_moves()})
            self._lookup = table
        return self._lookup

    def returns(self) -> list[float]:
        return [float(value) for value in self.state.returns()]

    def player_moves(self) -> int:
        """Number of non-chance moves in the game so far (the reported game length)."""
        return sum(1 for item in self.state.full_history() if item.player != CHANCE)


def start_session(
    game: pyspiel.Game,
    case: str,
    seat: int,
    seed: int,
    opponent: Opponent,
    max_random_steps: int,
) -> GameSession:
    """The task's start: k ~ U{0..max_random_steps} uniformly random player moves from the root
    (chance resolved by its distribution), then chance/opponent moves up to the model's first
    decision. If that would end the game first, fewer random moves are tried, down to none."""
    first = random.Random(rng_seed(seed, START_STREAM, 0)).randrange(max_random_steps + 1)
    randomizer = RandomOpponent()
    for steps in range(first, -1, -1):
        session = GameSession(game, seat, seed, opponent)
        rng = random.Random(rng_seed(seed, START_STREAM, steps + 1))
        made = 0
        while made < steps and not session.is_terminal:
            player = session.state.current_player()
            if player == CHANCE:
                session.apply(sample_chance(session.state, rng))
            else:
                session.apply(randomizer.choose(session.state, rng))
                made += 1
        if session.is_terminal:
            continue
        session.advance()
        if not session.is_terminal:
            return session
    raise ValueError(f"case {case!r}: player {seat} never gets to move (the game ends first)")
