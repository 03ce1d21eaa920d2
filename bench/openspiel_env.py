"""vf_openspiel: environment overhead per model turn vs raw pyspiel.

For each game and opponent, plays games through the environment with a random legal mover and
measures, per model turn:
- env: `env_response` (parse the reply, exact-match the move, apply it, opponent/chance moves,
  build the next prompt text), with the opponent's own decision time measured separately;
- rollout: one turn of the whole verifiers loop (`env.rollout` with a scripted client: message
  plumbing, stop checks, trajectory) around env_response;
- raw: the same game's moves replayed on a bare pyspiel state with `apply_action` plus the
  player's view string (`observation_string` / `information_state_string`) after each move;
- raw+legal: raw plus the legal moves' strings (`action_to_string`) at each model decision, the
  pyspiel work any prompt that lists moves must do (chess SAN strings dominate it).
Ratios are env/raw, (env - opponent)/raw and (env - opponent)/(raw+legal), measured in the same
run on the same games.

The rollout column is measured against the random opponent only (against MCTS it is the search).
Against MCTS, env-opp also holds the hop to the worker thread that runs the search (about 0.1 ms
idle, a few ms on a loaded machine).

Run: .venv/bin/python bench/openspiel_env.py   (about 1 minute on 2 cores)

Prints one table row per game and opponent and saves them as JSON to
bench/results/openspiel_env.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import pyspiel
import verifiers as vf
import vf_openspiel
from vf_openspiel.env import RECORD_KEY, SESSION_KEY
from vf_openspiel.scripted import random_mover

from rlvr.scripted import ScriptedClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save  # noqa: E402

CASES = ("tic_tac_toe", "chess", "go(board_size=9)")
HEADER = (
    f"{'case':17s} {'opponent':9s} {'turns':>5s} {'raw':>6s} {'raw+leg':>7s} {'env':>9s} "
    f"{'opp':>9s} {'env-opp':>7s} {'rollout':>9s} {'env/raw':>8s} {'-opp/raw':>8s} "
    f"{'-opp/r+l':>8s}   (times in us per model turn)"
)
ROW = (
    "{case:17s} {opponent:9s} {turns:5d} {raw_us:6.1f} {raw_legal_us:7.1f} {env_us:9.1f} "
    "{opponent_us:9.1f} {env_excl_opponent_us:7.1f} {rollout:>9s} {ratio_env_vs_raw:8.1f} "
    "{ratio_env_excl_opponent_vs_raw:8.1f} {ratio_env_excl_opponent_vs_raw_legal:8.2f}"
)


class TimedOpponent:
    """Wraps an opponent and adds up the time spent choosing moves."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.slow = inner.slow
        self.seconds = 0.0

    def choose(self, state, rng):
        start = time.perf_counter()
        action = self.inner.choose(state, rng)
        self.seconds += time.perf_counter() - start
        return action


async def time_env_turns(env: vf.Environment, row: dict, seed: int) -> tuple[float, int, dict]:
    """Drives setup_state + env_response directly; returns (seconds, model turns, record)."""
    state = await env.init_state(row, ScriptedClient(random_mover(seed)), "bench", {})
    await env.setup_state(state)
    rng = random.Random(seed)
    seconds, turns = 0.0, 0
    while state.get("final_env_response") is None:
        action, _ = rng.choice(state[SESSION_KEY].legal_moves())
        messages = [vf.AssistantMessage(content=f"<move>{action}</move>")]
        start = time.perf_counter()
        await env.env_response(messages, state)
        seconds += time.perf_counter() - start
        turns += 1
    session = state[SESSION_KEY]
    record = dict(state[RECORD_KEY], history=list(session.history))
    return seconds, turns, record


def time_raw_replay(case: str, record: dict, start_len: int, legal: bool) -> float:
    """apply_action + view string for every move made after the start position (and, if
    `legal`, the legal moves' strings wherever the model is to move)."""
    game = pyspiel.load_game(case)
    seat = record["seat"]
    perfect = game.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION
    state = game.new_initial_state()
    for action in record["history"][:start_len]:
        state.apply_action(action)
    view = state.observation_string if perfect else state.information_state_string
    start = time.perf_counter()
    for action in record["history"][start_len:]:
        state.apply_action(action)
        view(seat)
        if legal and state.current_player() == seat:
            [state.action_to_string(seat, move) for move in state.legal_actions()]
    return time.perf_counter() - start


async def time_rollouts(env: vf.Environment, rows, min_turns: int) -> float:
    """Seconds per model turn of whole rollouts (verifiers loop + scripted client)."""
    seconds, turns, index = 0.0, 0, 0
    while turns < min_turns:
        client = ScriptedClient(random_mover(1000 + index))
        start = time.perf_counter()
        state = await env.rollout(rows[index % len(rows)], client, "bench", {})
        seconds += time.perf_counter() - start
        turns += len(state["trajectory"])
        index += 1
    return seconds / turns


async def bench_one(case: str, opponent: str, games: int, min_turns: int, args) -> dict:
    """Plays the case's tasks (cycling with new mover seeds) until `games` and `min_turns`."""
    max_turns = 400 if opponent == "random" else args.mcts_max_turns
    env = vf_openspiel.load_environment(
        cases=[case],
        opponent=opponent,
        mcts_simulations=args.mcts_simulations,
        num_tasks_per_case=games,
        max_turns=max_turns,
    )
    timed = TimedOpponent(env.opponents[case])
    env.opponents[case] = timed
    rows = env.get_dataset()
    env_s = raw_s = floor_s = 0.0
    turns = played = 0
    while played < games or turns < min_turns:
        row = rows[played % len(rows)]
        seconds, n, record = await time_env_turns(env, row, played)
        env_s += seconds
        turns += n
        played += 1
        start_len = len(row["info"]["start_actions"])
        raw_s += time_raw_replay(case, record, start_len, legal=False)
        floor_s += time_raw_replay(case, record, start_len, legal=True)
    opponent_s = timed.seconds
    rollout = await time_rollouts(env, rows, min_turns) if opponent == "random" else None
    per = 1e6 / turns
    return {
        "case": case,
        "opponent": opponent if opponent == "random" else f"mcts({args.mcts_simulations})",
        "games": played,
        "turns": turns,
        "raw_us": raw_s * per,
        "raw_legal_us": floor_s * per,
        "env_us": env_s * per,
        "opponent_us": opponent_s * per,
        "env_excl_opponent_us": (env_s - opponent_s) * per,
        "rollout_us": rollout * 1e6 if rollout is not None else None,
        "ratio_env_vs_raw": env_s / raw_s,
        "ratio_env_excl_opponent_vs_raw": (env_s - opponent_s) / raw_s,
        "ratio_env_excl_opponent_vs_raw_legal": (env_s - opponent_s) / floor_s,
    }


async def run_all(args) -> list[dict]:
    rows = []
    for opponent, games, min_turns in (
        ("random", args.games, args.min_turns),
        ("mcts", args.mcts_games, args.mcts_min_turns),
    ):
        for case in CASES:
            rows.append(await bench_one(case, opponent, games, min_turns, args))
            row = rows[-1]
            rollout = "-" if row["rollout_us"] is None else f"{row['rollout_us']:.1f}"
            print(ROW.format(rollout=rollout, **row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=10, help="min games per case vs random")
    parser.add_argument("--min-turns", type=int, default=1000, help="min model turns vs random")
    parser.add_argument("--mcts-games", type=int, default=2, help="min games per case vs mcts")
    parser.add_argument("--mcts-min-turns", type=int, default=40, help="min model turns vs mcts")
    parser.add_argument("--mcts-simulations", type=int, default=100)
    parser.add_argument("--mcts-max-turns", type=int, default=20, help="model moves cap vs mcts")
    args = parser.parse_args()
    print(HEADER)
    rows = asyncio.run(run_all(args))
    save("openspiel_env", {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
