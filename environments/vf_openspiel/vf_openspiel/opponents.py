"""Opponent policies. Every choice takes a `random.Random` seeded by the task and the ply, so the
same task and the same moves always give the same opponent reply.

MCTS uses open_spiel's C++ `MCTSBot` (it releases the GIL, so the environment runs it in a worker
thread). In imperfect-information games the bot never searches the true state, which would let it
see the model's hidden cards or moves: it searches worlds re-sampled to agree with its own
information state (determinized, "perfect-information Monte Carlo" search) and plays the majority
choice.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Protocol

import pyspiel

CHANCE = int(pyspiel.PlayerId.CHANCE)
UCT_C = 2.0
MCTS_MEMORY_MB = 256
MAX_WORLDS = 8
WORLD_RESTARTS = 20


class Opponent(Protocol):
    """Chooses an action for the player to move at a decision node."""

    name: str
    slow: bool

    def choose(self, state: pyspiel.State, rng: random.Random) -> int: ...


def sample_chance(state: pyspiel.State, rng: random.Random) -> int:
    """Draws a chance outcome from the game's own distribution."""
    outcomes, probs = zip(*state.chance_outcomes(), strict=True)
    return int(rng.choices(outcomes, weights=probs)[0])


class RandomOpponent:
    """Uniform over legal actions: the cheap baseline."""

    name = "random"
    slow = False

    def choose(self, state: pyspiel.State, rng: random.Random) -> int:
        legal = state.legal_actions()
        return int(legal[rng.randrange(len(legal))])


def view_key(state: pyspiel.State, player: int, use_info_state: bool) -> str:
    """What `player` knows at `state`: two states with the same key are indistinguishable to it."""
    if use_info_state:
        return state.information_state_string(player)
    return state.observation_string(player)


def _consistent_options(
    world: pyspiel.State, player: int, target: str, use_info_state: bool
) -> list[tuple[int, float]]:
    """Moves at `world` (chance outcomes with their probabilities, or another player's legal
    actions, equally weighted) after which `player` sees exactly `target`."""
    if world.is_chance_node():
        options = world.chance_outcomes()
    else:
        options = [(action, 1.0) for action in world.legal_actions()]
    return [
        (action, weight)
        for action, weight in options
        if view_key(world.child(action), player, use_info_state) == target
    ]


def sample_world(
    state: pyspiel.State, player: int, rng: random.Random, use_info_state: bool
) -> pyspiel.State | None:
    """A state `player` cannot tell apart from `state`, with everything hidden from it re-drawn.

    Replays the real history. The player's own actions are kept; every other move (chance or
    another player's) is re-drawn among the moves that leave the player's view identical to the
    real one at that point, so hidden cards and hidden moves never reach the search. Returns None
    when no consistent world turns up (the caller then plays at random).
    """
    game = state.get_game()
    history = [(item.player, item.action) for item in state.full_history()]
    real_views: list[str] = []
    real = game.new_initial_state()
    for _, action in history:
        real.apply_action(action)
        real_views.append(view_key(real, player, use_info_state))
    for _ in range(WORLD_RESTARTS):
        world = game.new_initial_state()
        for (actor, action), target in zip(history, real_views, strict=True):
            if actor != player:
                fits = _consistent_options(world, player, target, use_info_state)
                if not fits:
                    break
                action = rng.choices(fits, weights=[weight for _, weight in fits])[0][0]
            elif action not in world.legal_actions():
                break
            world.apply_action(action)
        else:
            return world
    return None


class MCTSOpponent:
    """UCT search with random rollouts (open_spiel's C++ MCTSBot)."""

    name = "mcts"
    slow = True

    def __init__(self, game: pyspiel.Game, simulations: int):
        if simulations < 1:
            raise ValueError(f"mcts_simulations must be >= 1, got {simulations}")
        self.game = game
        self.simulations = simulations
        game_type = game.get_type()
        self.perfect_info = (
            game_type.information == pyspiel.GameType.Information.PERFECT_INFORMATION
        )
        self.use_info_state = game_type.provides_information_state_string

    def _search(self, state: pyspiel.State, simulations: int, seed: int, solve: bool) -> int:
        evaluator = pyspiel.RandomRolloutEvaluator(1, seed)
        bot = pyspiel.MCTSBot(
            self.game, evaluator, UCT_C, simulations, MCTS_MEMORY_MB, solve, seed, False
        )
        return int(bot.step(state))

    def choose(self, state: pyspiel.State, rng: random.Random) -> int:
        if self.perfect_info:
            return self._search(state, self.simulations, rng.randrange(2**31 - 1), True)
        player = state.current_player()
        worlds = min(MAX_WORLDS, self.simulations)
        votes: Counter[int] = Counter()
        for _ in range(worlds):
            world = sample_world(state, player, rng, self.use_info_state)
            if world is None:
                continue
            seed = rng.randrange(2**31 - 1)
            votes[self._search(world, max(1, self.simulations // worlds), seed, False)] += 1
        legal = state.legal_actions()
        if not votes:
            return int(legal[rng.randrange(len(legal))])
        # Highest vote count; ties go to the lowest action id so the choice stays deterministic.
        return max(sorted(votes), key=lambda action: votes[action])


def make_opponent(kind: str, game: pyspiel.Game, mcts_simulations: int) -> Opponent:
    """Builds the opponent named by the `opponent` argument."""
    if kind == "random":
        return RandomOpponent()
    if kind == "mcts":
        return MCTSOpponent(game, mcts_simulations)
    raise ValueError(f"opponent must be 'random' or 'mcts', got {kind!r}")
