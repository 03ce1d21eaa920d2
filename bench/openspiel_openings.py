"""How vf_openspiel's `max_random_steps` shapes tic-tac-toe tasks against the random opponent.

The tic-tac-toe GRPO recipe (configs/examples/learn_openspiel_smollm2_cpu.yaml) picks its
opening depth from these numbers. For each depth, over the tasks the environment builds (task
seed `--seed`, seats alternating), computed exactly by walking the game tree from each task's
start position (no sampling):

- `model moves`: the model's moves in a game when both sides play uniformly random legal moves
  (what a freshly warm-started policy roughly does): the turns a rollout generates and trains;
- `random` and `best`: the expected outcome reward (win 1, draw 0.5, loss 0) of random play and
  of the best play against the random opponent (expectimax): the headroom GRPO can take;
- `group signal`: the chance that a group of `--group` random games from the same position does
  not end all alike, i.e. that GRPO's group has a non-zero advantage;
- `win in one`: the share of start positions where the model can win with its first move.

Then the expected reward of simple scripted policies on the bench's evaluation sets (task seed
1: 200 games of depth 4, 100 from the empty board): which skills the held-out reward pays.

    .venv/bin/python bench/openspiel_openings.py     # ~30 s; bench/results/openspiel_openings.json
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import pyspiel
from vf_openspiel.cases import load_case
from vf_openspiel.opponents import RandomOpponent
from vf_openspiel.session import start_session, task_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

CASE = "tic_tac_toe"
GAME = load_case(CASE)
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
History = tuple[int, ...]
# a policy: (state, seat) -> the moves it picks among, uniformly
Policy = Callable[[pyspiel.State, int], list[int]]


def state_of(history: History) -> pyspiel.State:
    state = GAME.new_initial_state()
    for action in history:
        state.apply_action(action)
    return state


def reward(state: pyspiel.State, seat: int) -> float:
    """The environment's outcome reward of a finished game: win 1, draw 0.5, loss 0."""
    return (state.returns()[seat] + 1) / 2


def completions(state: pyspiel.State, player: int) -> list[int]:
    """Empty squares that complete a line of `player`'s two marks."""
    cells = str(state).replace("\n", "")
    mark = "xo"[player]
    return sorted(
        {
            cell
            for line in LINES
            for cell in line
            if cells[cell] == "." and sum(cells[i] == mark for i in line) == 2
        }
    )


def random_policy(state: pyspiel.State, seat: int) -> list[int]:
    return state.legal_actions()


def win_in_one(state: pyspiel.State, seat: int) -> list[int]:
    """A winning move when there is one, else any legal move."""
    return completions(state, seat) or state.legal_actions()


def win_or_block(state: pyspiel.State, seat: int) -> list[int]:
    """A winning move, else a move that stops the opponent's win in one, else any."""
    return completions(state, seat) or completions(state, 1 - seat) or state.legal_actions()


POLICIES: dict[str, Policy] = {
    "random": random_policy,
    "win in one": win_in_one,
    "win or block": win_or_block,
}


@functools.cache
def value(history: History, seat: int, policy: str) -> float:
    """Expected reward of `seat` playing `policy` (or "best": expectimax) against the random
    opponent from the position after `history`."""
    state = state_of(history)
    if state.is_terminal():
        return reward(state, seat)
    if state.current_player() != seat:
        moves = state.legal_actions()
    elif policy == "best":
        return max(value((*history, a), seat, policy) for a in state.legal_actions())
    else:
        moves = POLICIES[policy](state, seat)
    return statistics.fmean(value((*history, a), seat, policy) for a in moves)


@functools.cache
def random_play(history: History, seat: int) -> tuple[float, float, float, float]:
    """Under random play from `history`: P(win), P(draw), P(loss) of `seat`, and its moves."""
    state = state_of(history)
    if state.is_terminal():
        outcome = reward(state, seat)
        return (float(outcome == 1.0), float(outcome == 0.5), float(outcome == 0.0), 0.0)
    children = [random_play((*history, a), seat) for a in state.legal_actions()]
    win, draw, loss, moves = (statistics.fmean(column) for column in zip(*children, strict=True))
    return win, draw, loss, moves + (state.current_player() == seat)


def starts(depth: int, tasks: int, seed: int) -> list[tuple[History, int]]:
    """The environment's start positions (history, model seat) of `tasks` tasks."""
    positions = []
    for task in range(tasks):
        seat = task % 2
        session = start_session(
            GAME, CASE, seat, task_seed(seed, CASE, task), RandomOpponent(), depth
        )
        positions.append((tuple(session.history), seat))
    return positions


def depth_row(depth: int, tasks: int, seed: int, group: int) -> dict[str, float]:
    """The numbers of one opening depth (module docstring)."""
    rows = []
    for history, seat in starts(depth, tasks, seed):
        win, draw, loss, moves = random_play(history, seat)
        alike = win**group + draw**group + loss**group
        state = state_of(history)
        rows.append(
            {
                "model moves": moves,
                "random": value(history, seat, "random"),
                "best": value(history, seat, "best"),
                "group signal": 1 - alike,
                "win in one": float(bool(completions(state, seat))),
            }
        )
    return {key: statistics.fmean(row[key] for row in rows) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=list(range(9)))
    parser.add_argument("--tasks", type=int, default=400, help="tasks per depth (recipe: 400)")
    parser.add_argument("--seed", type=int, default=0, help="task seed (training: 0)")
    parser.add_argument("--group", type=int, default=8, help="GRPO group size")
    args = parser.parse_args()
    depths = {d: depth_row(d, args.tasks, args.seed, args.group) for d in args.depths}
    print("max_random_steps | " + " | ".join(depths[args.depths[0]]))
    for depth, row in depths.items():
        print(f"{depth} | " + " | ".join(f"{v:.3f}" for v in row.values()))
    evaluation = {}
    for name, depth, games in (("held_out", 4, 200), ("opening", 0, 100)):
        positions = starts(depth, games, seed=1)
        evaluation[name] = {
            policy: statistics.fmean(value(h, seat, policy) for h, seat in positions)
            for policy in (*POLICIES, "best")
        }
        print(f"{name} ({games} games, depth {depth}): {evaluation[name]}")
    save(
        "openspiel_openings",
        {
            "tasks": args.tasks,
            "seed": args.seed,
            "group": args.group,
            "depths": depths,
            "evaluation_sets": evaluation,
        },
    )


if __name__ == "__main__":
    main()
