"""Unit tests for vf_openspiel: games played to the end through the real rollout loop
(`env.rollout` -> get_prompt_messages -> env_response -> is_completed) with a scripted client
that implements verifiers' Client interface, then scored by the environment's rubric.

Turn limit: the play-through tests use max_turns=400 (model moves). Random chess is the longest
default game (about 320 plies on average, up to ~460 seen, i.e. ~230 moves per side); every other
default game has a hard length bound below 400 moves per side. The whole file takes about 25 s
wall-clock (7 s CPU) on the shared 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics

import pyspiel
import pytest
import verifiers as vf
import vf_openspiel
from verifiers.utils.save_utils import state_to_output
from vf_openspiel.cases import DEFAULT_CASES, load_case, resolve_cases
from vf_openspiel.corpus import (
    EXPLOITS,
    HONEST_STYLES,
    ILLEGALITY_RULES,
    false_negative_rates,
    honest_policies,
    means,
)
from vf_openspiel.corpus import play as play_all
from vf_openspiel.opponents import MCTSOpponent, sample_world
from vf_openspiel.parser import HEDGE, NO_ANSWER, extract_move, extract_moves, match_move, read_move
from vf_openspiel.scripted import Policy, legal_from_prompt, random_mover
from vf_openspiel.session import GameSession

from rlvr.scripted import ScriptedClient


def constant(reply: str) -> Policy:
    return lambda prompt: reply


def play(env: vf.Environment, row: dict, policy: Policy) -> vf.State:
    """One rollout through the environment's own loop, scored by its rubric."""

    async def run() -> vf.State:
        state = await env.rollout(row, ScriptedClient(policy), "scripted", {})
        await env.rubric.score_rollout(state)
        return state

    return asyncio.run(run())


def first_row(**kwargs) -> tuple[vf.Environment, dict]:
    env = vf_openspiel.load_environment(num_tasks_per_case=1, **kwargs)
    return env, env.get_dataset()[0]


# --------------------------------------------------------------------------- cases and config
def test_default_cases_load_with_open_spiel_parameter_names():
    for case in DEFAULT_CASES:
        game = load_case(case)
        assert game.get_type().dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
    assert pyspiel.load_game("go(board_size=13)").get_parameters()["board_size"] == 13
    assert pyspiel.load_game("dots_and_boxes(num_rows=5,num_cols=5)").num_distinct_actions() == 60


def test_game_types_short_names_lists_and_strings():
    assert resolve_cases(None, None, None, "hex") == [
        c for c in DEFAULT_CASES if c.startswith("hex(")
    ]
    both = resolve_cases(None, None, None, "hex, chess")
    assert len(both) == 4 and "chess" in both
    assert resolve_cases(None, None, None, ["go(board_size=9)"]) == ["go(board_size=9)"]
    with pytest.raises(ValueError, match="match no case"):
        resolve_cases(None, None, None, "hexx")


def test_game_list_and_game_configs_build_one_case_per_pair():
    cases = resolve_cases(
        None,
        ["hex", "go", "tic_tac_toe"],
        [[{"board_size": 5}, {"board_size": 7}], {"board_size": 9, "komi": 6.5}, None],
        None,
    )
    assert cases == [
        "hex(board_size=5)",
        "hex(board_size=7)",
        "go(board_size=9,komi=6.5)",
        "tic_tac_toe",
    ]
    assert resolve_cases("hex(board_size=5),chess", None, None, None) == [
        "hex(board_size=5)",
        "chess",
    ]
    with pytest.raises(ValueError, match="one config"):
        resolve_cases(None, ["hex", "go"], [{"board_size": 5}], None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cases": ["goofspiel"]}, "simultaneous-move game"),
        ({"cases": ["no_such_game"]}, "does not load"),
        ({"mode": "turn"}, "mode must be one of"),
        ({"reward_mode": "win"}, "reward_mode must be one of"),
        ({"opponent": "alphazero"}, "opponent must be"),
        ({"model_player": 2}, "has 2 players"),
        ({"model_player": "first"}, "model_player must be"),
        ({"num_tasks_per_case": 0}, "num_tasks_per_case must be"),
        ({"mode": "move", "playouts": 0}, "playouts must be"),
        ({"playouts": 8}, "needs mode='move'"),
        ({"opponent": "mcts", "mcts_simulations": 0}, "mcts_simulations must be"),
        ({"truncation_reward": 1.5}, "truncation_reward must be a number in"),
        ({"truncation_reward": "position"}, "truncation_reward must be a number in"),
    ],
)
def test_bad_arguments_fail_at_load_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        vf_openspiel.load_environment(**kwargs)


def test_turn_based_wrapper_plays_a_simultaneous_game():
    env, row = first_row(cases=["turn_based_simultaneous_game(game=goofspiel(num_cards=4))"])
    state = play(env, row, random_mover(0))
    assert state["openspiel"]["ended_by"] == "game_over"


def test_info_lists_case_task_and_seat_and_seats_alternate_or_stay_fixed():
    env = vf_openspiel.load_environment(game_types="tic_tac_toe,kuhn_poker", num_tasks_per_case=4)
    infos = env.get_dataset()["info"]
    assert [(i["case"], i["task_id"], i["seat"]) for i in infos[:4]] == [
        ("tic_tac_toe", 0, 0),
        ("kuhn_poker", 0, 0),
        ("tic_tac_toe", 1, 1),
        ("kuhn_poker", 1, 1),
    ]
    fixed = vf_openspiel.load_environment(
        game_types="tic_tac_toe", model_player=1, num_tasks_per_case=3
    )
    assert {i["seat"] for i in fixed.get_dataset()["info"]} == {1}


# --------------------------------------------------------------------------- full games
def test_every_default_case_plays_to_the_end_within_its_turn_limit():
    env = vf_openspiel.load_environment(num_tasks_per_case=2, max_turns=400)
    rows = env.get_dataset()
    assert {row["info"]["case"] for row in rows} == set(DEFAULT_CASES)
    for index, row in enumerate(rows):
        state = play(env, row, random_mover(index))
        record = state["openspiel"]
        assert state.get("error") is None, record["case"]
        assert record["ended_by"] == "game_over", record["case"]
        assert state["stop_condition"] == "has_final_env_response"
        assert 1 <= record["model_moves"] <= 400
        metrics = state["metrics"]
        assert metrics["legal_rate"] == 1.0
        assert metrics["win"] + metrics["draw"] + metrics["loss"] == 1.0
        assert 0.0 <= state["reward"] <= 1.0
        # The record's history replays to the same final position under pyspiel's own rules.
        replay = pyspiel.load_game(record["case"]).new_initial_state()
        for action in record["history"]:
            replay.apply_action(action)
        assert replay.is_terminal() and replay.returns() == record["returns"]


def test_mcts_opponent_plays_real_games_and_beats_random_play():
    cases = ["tic_tac_toe", "kuhn_poker", "leduc_poker", "liars_dice", "hex(board_size=5)"]
    env = vf_openspiel.load_environment(
        cases=cases, opponent="mcts", mcts_simulations=30, num_tasks_per_case=2
    )
    for index, row in enumerate(env.get_dataset()):
        state = play(env, row, random_mover(index))
        assert state["openspiel"]["ended_by"] == "game_over", row["info"]["case"]

    def mean_outcome(opponent: str) -> float:
        env = vf_openspiel.load_environment(
            cases=["tic_tac_toe"], opponent=opponent, mcts_simulations=300, num_tasks_per_case=30
        )
        return statistics.mean(
            play(env, row, random_mover(7))["reward"] for row in env.get_dataset()
        )

    assert mean_outcome("mcts") < mean_outcome("random") - 0.2


def test_move_mode_is_one_decision_scored_by_a_playout():
    env = vf_openspiel.load_environment(
        game_types="connect_four", mode="move", num_tasks_per_case=3
    )
    for row in env.get_dataset():
        state = play(env, row, random_mover(1))
        record = state["openspiel"]
        assert record["replies"] == 1 and record["model_moves"] == 1
        assert record["ended_by"] == "game_over"
        assert len(state["trajectory"]) == 1


def random_play_value(state: pyspiel.State, seat: int) -> float:
    """`seat`'s expected return, mapped into [0, 1], when every seat plays uniformly random
    legal moves from `state` (exact; small games only)."""
    if state.is_terminal():
        return (state.returns()[seat] + 1) / 2
    return statistics.fmean(random_play_value(state.child(a), seat) for a in state.legal_actions())


def test_move_mode_playouts_score_a_move_by_its_value_against_random_play():
    """With 64 playouts a move's reward is within the sampling error of its exact value under
    random play (one playout is a single 0 / 0.5 / 1 draw of it); a winning move scores 1."""
    env = vf_openspiel.load_environment(
        cases=["tic_tac_toe"], mode="move", playouts=64, max_random_steps=8, num_tasks_per_case=12
    )
    errors = []
    for index, row in enumerate(env.get_dataset()):
        state = play(env, row, random_mover(index))
        record, start = state["openspiel"], row["info"]["start_actions"]
        position = pyspiel.load_game("tic_tac_toe").new_initial_state()
        for action in [*start, record["history"][len(start)]]:  # the opening, then the move
            position.apply_action(action)
        exact = random_play_value(position, record["seat"])
        assert state["reward"] == pytest.approx(exact, abs=0.25), row["info"]
        if exact == 1.0:
            assert state["reward"] == 1.0
        errors.append(abs(state["reward"] - exact))
        assert "Scored by 64 playouts" in state["completion"][-1].content
        assert play(env, row, random_mover(index))["reward"] == state["reward"]  # reproducible
    assert statistics.fmean(errors) < 0.08


def test_turn_limit_counts_moves_not_illegal_replies_and_scores_the_minimum():
    replies = iter(["<move>nonsense</move>", "no tag"] + [None] * 10)

    def sometimes_illegal(prompt):
        reply = next(replies)
        return reply if reply is not None else random_mover(3)(prompt)

    env, row = first_row(cases=["chess"], max_turns=3)
    state = play(env, row, sometimes_illegal)
    record = state["openspiel"]
    assert record["ended_by"] == "turn_limit"
    assert record["model_moves"] == 3 and record["illegal_attempts"] == 2 and record["replies"] == 5
    assert state["metrics"]["unfinished"] == 1.0 and state["metrics"]["win"] == 0.0
    assert record["returns"] == [0.0, 0.0]  # what the position alone would have paid: 0.5
    assert state["metrics"]["outcome"] == 0.0
    assert state["metrics"]["legal_rate"] == pytest.approx(3 / 5)


def game_value(state: pyspiel.State, seat: int) -> float:
    """Minimax value of a position for `seat` (perfect play by everyone; small games only)."""
    if state.is_terminal():
        return state.returns()[seat]
    values = [game_value(state.child(action), seat) for action in state.legal_actions()]
    return max(values) if state.current_player() == seat else min(values)


def lowest_id(prompt) -> str:
    """Plays the first listed legal move, whatever the position: a reliably bad player."""
    return f"<move>{legal_from_prompt(prompt)[0][0]}</move>"


@pytest.mark.parametrize(("truncation_reward", "expected"), [(None, 0.0), (0.25, 0.25)])
def test_a_game_cut_at_max_turns_from_a_lost_position_scores_the_minimum(
    truncation_reward, expected
):
    """The model (o) plays the lowest legal id against MCTS; after its one move it has lost by
    force, the board is unfinished (returns 0, i.e. 0.5 if the position were scored), and the cut
    game pays the minimum, or what `truncation_reward` says."""
    args = {} if truncation_reward is None else {"truncation_reward": truncation_reward}
    env, row = first_row(
        cases=["tic_tac_toe"],
        model_player=1,
        max_random_steps=0,
        opponent="mcts",
        max_turns=1,
        **args,
    )
    state = play(env, row, lowest_id)
    record = state["openspiel"]
    assert record["ended_by"] == "turn_limit" and record["returns"] == [0.0, 0.0]
    position = pyspiel.load_game("tic_tac_toe").new_initial_state()
    for action in record["history"]:
        position.apply_action(action)
    assert game_value(position, seat=1) == -1.0  # lost with best play from here
    assert state["reward"] == state["metrics"]["outcome"] == expected
    assert state["metrics"]["unfinished"] == 1.0


def test_reasoning_before_a_lone_closing_think_tag_is_not_searched():
    """Chat templates may put <think> in the generation prompt; the reply then holds only
    </think>, and a move named in the reasoning before it is not the model's answer."""
    assert extract_move("I could play <move>a1</move> here.</think> <move>b2</move>") == "b2"
    assert extract_move("maybe <move>a1</move> or not</think> I am unsure.") is None
    assert extract_move("<move>a1</move> <THINK>second thoughts") == "a1"
    env, row = first_row(cases=["tic_tac_toe"], model_player=0, max_random_steps=0)
    state = play(env, row, constant("maybe <move>0</move>?</think>"))
    assert state["openspiel"]["ended_by"] == "forfeit" and state["reward"] == 0.0


# --------------------------------------------------------------------------- exploits
@pytest.mark.parametrize("name", sorted(EXPLOITS))
@pytest.mark.parametrize("reward_mode", ["outcome", "legal"])
def test_illegal_replies_forfeit_and_score_the_minimum(name, reward_mode):
    env, row = first_row(cases=["tic_tac_toe"], reward_mode=reward_mode, max_illegal_moves=2)
    state = play(env, row, EXPLOITS[name])
    record = state["openspiel"]
    assert record["ended_by"] == "forfeit"
    assert record["illegal_attempts"] == 3 and record["legal_replies"] == 0
    assert state["reward"] == 0.0
    assert state["metrics"]["loss"] == 1.0 and state["metrics"]["forfeit"] == 1.0
    assert "Illegal move" in state["completion"][1].content
    assert "you lose the game" in state["completion"][-1].content


def test_reasoning_outside_the_tag_is_ignored_and_text_or_id_both_count():
    env, row = first_row(cases=["tic_tac_toe"], model_player=0, max_random_steps=0)
    state = play(env, row, lambda p: "x(0,0) looks bad.\n<move>x(1,1)</move>")
    assert state["openspiel"]["history"][0] == 4
    env, row = first_row(cases=["tic_tac_toe"], model_player=0, max_random_steps=0)
    state = play(env, row, constant("<move> 4 </move>"))
    assert state["openspiel"]["history"][0] == 4


def test_exact_match_never_confuses_a1_with_a10():
    session = GameSession(pyspiel.load_game("hex(board_size=11)"), 0, 0, None)
    lookup = session.lookup()
    assert match_move(extract_move("<move>a1</move>"), lookup) == 0
    assert match_move(extract_move("<move>a10</move>"), lookup) == 99
    for reply in (
        "<move>a</move>",
        "<move>a1a10</move>",
        "<move>a1 a10</move>",
        "a1",
        "<move></move>",
    ):
        assert match_move(extract_move(reply), lookup) is None, reply
    assert match_move("A1", lookup) == 0  # letter case ignored where it names one move
    clash = {"0": 0, "1": 1, "Bb5": 0, "bb5": 1}
    assert match_move("BB5", clash) is None and match_move("bb5", clash) == 1
    go = GameSession(pyspiel.load_game("go(board_size=13)"), 0, 0, None).lookup()
    assert go["B a1"] != go["B a10"] and match_move("B a1", go) == go["B a1"]


def test_letter_case_is_meaning_in_a_mixed_case_notation():
    """Chess's `bxc4` (a pawn capture) never plays the legal bishop move `Bxc4`, nor the other
    way round; wrapping and spaces are still ignored there."""
    bishop, pawn = {"0": 0, "Bxc4": 0, "1": 1, "e4": 1}, {"0": 0, "bxc4": 0}
    assert match_move("bxc4", bishop) is None and match_move("BXC4", bishop) is None
    assert match_move("Bxc4", pawn) is None
    assert match_move("**Bxc4**", bishop) == 0 and match_move("`B xc4`", bishop) == 0
    assert match_move("E4", bishop) == 1 and match_move("BXC4", pawn) == 0


def test_nested_listed_lines_and_long_moves_are_illegal_not_errors():
    lookup = {"0": 0, "b2": 0}
    for move in ("1:" * 5000 + "b2", "0: 0: b2", "b2" + " " * 10_000 + "x"):
        action, reason = read_move([move], lookup)
        assert action is None and "not one of your legal moves" in reason
    assert read_move(["0: b2"], lookup) == (0, "")


def test_legal_reward_is_the_fraction_of_legal_replies():
    turn = {"n": 0}

    def every_other_illegal(prompt):
        turn["n"] += 1
        return "<move>?</move>" if turn["n"] % 2 else random_mover(0)(prompt)

    env, row = first_row(cases=["tic_tac_toe"], reward_mode="legal", max_illegal_moves=20)
    state = play(env, row, every_other_illegal)
    record = state["openspiel"]
    assert record["ended_by"] == "game_over"
    assert state["reward"] == pytest.approx(record["legal_replies"] / record["replies"]) == 0.5


# --------------------------------------------------------------------------- chance, views, seeds
@pytest.mark.parametrize("seat", [0, 1])
def test_chance_first_game_starts_at_a_decision_and_pays_the_seat_return(seat):
    env, row = first_row(cases=["leduc_poker"], max_random_steps=0, model_player=seat)
    session = GameSession(
        load_case("leduc_poker"), seat, row["info"]["seed"], None, row["info"]["start_actions"]
    )
    assert session.state.current_player() == seat and not session.state.is_chance_node()
    assert len(row["info"]["start_actions"]) == 2 + seat  # two deals, then the opponent's bet
    first_prompt = row["prompt"][-1]["content"]
    assert session.state.information_state_string(seat) in first_prompt
    state = play(env, row, random_mover(seat))
    record = state["openspiel"]
    assert record["ended_by"] == "game_over"
    assert state["reward"] == pytest.approx((record["returns"][seat] + 13) / 26)
    assert all("Chance" not in m.content for m in state["completion"])


def test_views_are_information_state_when_hidden_and_observation_otherwise():
    for case, method in [
        ("chess", "observation_string"),
        ("liars_dice", "information_state_string"),
    ]:
        env, row = first_row(cases=[case])
        session = GameSession(
            load_case(case), row["info"]["seat"], 0, None, row["info"]["start_actions"]
        )
        assert getattr(session.state, method)(row["info"]["seat"]) in row["prompt"][-1]["content"]


def test_mcts_never_searches_the_models_hidden_cards():
    game = load_case("leduc_poker")
    state = game.new_initial_state()
    for action in (0, 5):  # the model (seat 0) holds card 0, the opponent card 5
        state.apply_action(action)
    state.apply_action(2)  # the model raises; the opponent (seat 1) must answer
    rng = random.Random(0)
    worlds = [sample_world(state, 1, rng, True) for _ in range(40)]
    assert all(w.information_state_string(1) == state.information_state_string(1) for w in worlds)
    assert len({w.information_state_string(0) for w in worlds}) > 1
    assert MCTSOpponent(game, 20).choose(state, random.Random(1)) in state.legal_actions()


def test_same_task_id_gives_the_same_prompt_and_the_same_game():
    for kwargs in (
        {"cases": ["chess", "go(board_size=9)"]},
        {"cases": ["leduc_poker", "tic_tac_toe"], "opponent": "mcts", "mcts_simulations": 20},
    ):
        first = vf_openspiel.load_environment(num_tasks_per_case=3, **kwargs).get_dataset()
        again = vf_openspiel.load_environment(num_tasks_per_case=3, **kwargs)
        second = again.get_dataset()
        assert first["prompt"] == second["prompt"] and first["info"] == second["info"]
        assert len({json.dumps(p) for p in first["prompt"]}) > 1  # tasks differ from each other
        for row in first:
            one, two = play(again, row, random_mover(5)), play(again, row, random_mover(5))
            assert one["openspiel"]["history"] == two["openspiel"]["history"]
            assert [m.content for m in one["completion"]] == [m.content for m in two["completion"]]


# --------------------------------------------------------------------------- state hygiene
def test_saved_state_is_json_and_holds_no_pyspiel_objects():
    env, row = first_row(cases=["othello"])
    state = play(env, row, random_mover(2))
    assert vf_openspiel.SESSION_KEY not in state
    output = state_to_output(state, state_columns=["openspiel"])
    json.loads(json.dumps(output, default=str))
    assert output["openspiel"]["ended_by"] == "game_over"


def test_a_rollout_stopped_by_an_error_scores_as_a_loss():
    calls = {"n": 0}

    def fails_on_third_call(prompt):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("server went away")
        return random_mover(0)(prompt)

    env, row = first_row(cases=["chess"])
    state = play(env, row, fails_on_third_call)
    assert state["error"] is not None
    assert state["openspiel"]["ended_by"] == "aborted"
    assert state["reward"] == 0.0 and state["metrics"]["loss"] == 1.0


@pytest.mark.parametrize("stops_with", ["context overflow", "timeout"])
def test_openspiel_legal_mode_aborted_game_does_not_keep_its_rate(stops_with):
    """In legal mode, one legal move and then a rollout verifiers stops (the reply bloated past
    the context, or the call timed out) scores 0, as in outcome mode: stopping early must not
    keep the perfect rate of a whole legal game, which a finished legal game still earns."""
    calls = {"n": 0}

    def one_move_then_stop(prompt):
        calls["n"] += 1
        if calls["n"] == 2:
            raise (vf.OverlongPromptError if stops_with == "context overflow" else TimeoutError)(
                stops_with
            )
        return random_mover(0)(prompt)

    env, row = first_row(cases=["chess"], reward_mode="legal")
    state = play(env, row, one_move_then_stop)
    record = state["openspiel"]
    assert record["ended_by"] == "aborted" and record["legal_replies"] == record["replies"] == 1
    assert state["reward"] == 0.0 and state["metrics"]["legal_rate"] == 0.0
    env, row = first_row(cases=["tic_tac_toe"], reward_mode="legal")
    finished = play(env, row, random_mover(0))
    assert finished["openspiel"]["ended_by"] == "game_over" and finished["reward"] == 1.0


def test_seat_labels_match_open_spiel():
    chess = pyspiel.load_game("chess").new_initial_state()
    assert chess.current_player() == 1  # White moves first and is player 1
    for game, symbol in [("tic_tac_toe", "x"), ("connect_four", "x"), ("hex(board_size=5)", "x")]:
        state = pyspiel.load_game(game).new_initial_state()
        state.apply_action(state.legal_actions()[0])
        assert str(state).count(symbol) == 1


# --------------------------------------------------------------------------- honest corpus
def test_openspiel_honest_move_styles_are_legal_in_every_default_case():
    """Every honest style of `vf_openspiel.corpus` (reasoning first, think block, id or text,
    spaces, letter case, the listed `id: move` line, markdown, quotes, the format mentioned with
    an empty tag, the move repeated as the final answer) plays legal moves in every default
    case: each illegality rule's false-negative rate on these replies is 0 (README table; with
    the rules before issue 31 -- exactly one tag, exact text -- 54% of these replies were
    illegal)."""
    env = vf_openspiel.load_environment(reward_mode="legal", num_tasks_per_case=1, max_turns=4)
    games = asyncio.run(play_all(env, honest_policies(seed=3), ScriptedClient))
    assert {g.case for g in games} == set(DEFAULT_CASES)
    assert set(means(games)) == set(HONEST_STYLES)
    assert sum(g.replies for g in games) >= 3 * len(games)
    rates = false_negative_rates(games)
    assert set(rates) == {*ILLEGALITY_RULES, "forfeit (outcome zeroed)"}
    assert rates == dict.fromkeys(rates, 0.0), rates
    assert means(games) == dict.fromkeys(HONEST_STYLES, 1.0)


def test_openspiel_honest_styles_out_earn_every_exploit_on_outcome():
    """Whole tic-tac-toe games against the random opponent: every honest style is paid its
    games' results, every exploit forfeits (0)."""
    env = vf_openspiel.load_environment(cases=["tic_tac_toe"], num_tasks_per_case=4)
    honest = means(asyncio.run(play_all(env, honest_policies(seed=5), ScriptedClient)))
    exploits = means(asyncio.run(play_all(env, EXPLOITS, ScriptedClient)))
    assert exploits == dict.fromkeys(EXPLOITS, 0.0)
    assert min(honest.values()) > 0.0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<move>4</move>", 4),
        ("<move>x(1,1)</move>", 4),
        ("<move>4: x(1,1)</move>", 4),  # the listed line
        ("<move>4: x(0,0)</move>", None),  # id and text name different moves
        ("<move>X(1, 1)</move>", 4),
        ("<move>**x(1,1)**</move>", 4),
        ("<move>`4`</move>", 4),
        ('<move>"x(1,1)"</move>', 4),
        ("Format: <move></move>. <move>4</move>", 4),  # an empty tag is no answer
        ("<move>id</move> is the format. <move>4</move>", 4),  # a placeholder names no move
        ("<move>x(1,1)</move> Final: <move>4</move>", 4),  # the same move twice
        ("<move>0</move> <move>4</move>", None),  # two different moves: a hedge
        ("<move>4</move> <move>0</move>", None),
        ("<move>4 0</move>", None),
        ("<move>x(1,1)x(0,0)</move>", None),
        ("<move>14</move>", None),  # substring of nothing legal, never 1 or 4
    ],
)
def test_read_move_takes_the_final_tag_and_names_one_legal_move(reply, expected):
    session = GameSession(pyspiel.load_game("tic_tac_toe"), 0, 0, None)
    action, reason = read_move(extract_moves(reply), session.lookup())
    assert action == expected
    assert (reason == "") == (expected is not None)


def test_read_move_says_why_a_reply_is_illegal():
    lookup = GameSession(pyspiel.load_game("tic_tac_toe"), 0, 0, None).lookup()
    assert read_move(extract_moves("I play x(1,1)."), lookup) == (None, NO_ANSWER)
    assert read_move(extract_moves("<move>0</move><move>4</move>"), lookup) == (None, HEDGE)
    assert read_move(["resign"], lookup) == (None, "'resign' is not one of your legal moves")


# --------------------------------------------------------------------------- packaged moves
PACKAGE_CASES = {  # case -> moves played from the root first (chance outcomes included)
    "tic_tac_toe": 2,
    "connect_four": 3,
    "hex(board_size=5)": 2,
    "go(board_size=9)": 4,
    "chess": 20,
    "breakthrough(rows=6,columns=6)": 8,
    "dots_and_boxes(num_rows=3,num_cols=3)": 3,
    "clobber(rows=5,columns=5)": 2,
    "kuhn_poker": 2,
    "leduc_poker": 2,
    "liars_dice": 2,
}
"""Games whose ids and texts look different (`a1`, `B a1`, `Nf3`, `a1b2*`, `P1(h,0,0)`, `x(1,1)`,
`Pass`, `1-2`), each past its opening so captures and checks are among the legal moves."""


def package_session(case: str, plies: int) -> GameSession:
    """The `case` position after `plies` random moves (seeded), at the mover's decision."""
    rng, state, actions = random.Random(7), load_case(case).new_initial_state(), []
    while len(actions) < plies or state.is_chance_node():
        actions.append(rng.choice(state.legal_actions()))
        state.apply_action(actions[-1])
    return GameSession(load_case(case), state.current_player(), 0, None, actions)


def one_move_packages(i: str, t: str) -> list[str]:
    """Honest packages around the one legal move with id `i` and text `t`."""
    return [
        *(f"{i} ({t})", f"{t} ({i})", f"{t} (id {i})", f"{i}: {t}", f"{t}: {i}", f"{i} - {t}"),
        *(f"Move: {t}", f"Action: {i}", f"Final answer: {t}", f"I play {t}", f"id {i}: {t}"),
        *(f"I'll play {i} ({t}).", f"{i}.", f"{t}.", f"{t}!", f"Move: {i}."),
        *(json.dumps({"id": int(i)}), json.dumps({"move": t}), json.dumps({"action": i})),
        json.dumps({"id": int(i), "move": t}),
        f"```json\n{json.dumps({'move': t})}\n```",
        *(f"**{t}**", f"`{t}`", f'"{t}"', f"**Move:** `{i}`", f"**{i}** (`{t}`)", f'I play "{t}".'),
    ]


def two_move_packages(i: str, t: str, j: str, u: str) -> list[str]:
    """Packages naming two different legal moves (`i`/`t` and `j`/`u`): one form each."""
    return [
        *(f"{i} ({u})", f"{u} ({i})", f"{t} (id {j})", f"{i}: {u}", f"{u}: {i}", f"{i} - {u}"),
        *(f"Move: {t} or {u}", f"I play {t} or {u}", f"Action: {i}, {j}", f"{i}. {j}."),
        *(json.dumps({"id": int(i), "move": u}), json.dumps({"move": t, "action": j})),
        *(f"**{t}** or `{u}`", f"**{i}** (`{u}`)", f'"{t}" "{u}"'),
    ]


def test_openspiel_one_named_move_in_any_package():
    """A tag reads as one legal move whatever package wraps it -- its id, its text or both (in
    either order), a label, trailing punctuation, a JSON object, markdown or quotes -- in games
    whose ids and texts look different; the false-negative rate of these honest packages is 0
    (with the parser before "Rewards round 6" it was 85%: 23 of the 27 forms were illegal). The
    same packages naming two different legal moves read as no move, and so does an id that is
    not legal, whatever wraps it."""
    honest = hedges = 0
    misread: list[tuple[str, str, int | None]] = []
    for case, plies in PACKAGE_CASES.items():
        session = package_session(case, plies)
        lookup = session.lookup()
        # up to 8 moves, those with signs first (`Nd6+`, `b5c4*`, `x(1,1)`, `1-2`, `B a1`)
        moves = sorted(session.legal_moves(), key=lambda move: move[1].isalnum())[:8]
        assert len(moves) >= 2, case
        for (action, text), (other, other_text) in zip(moves, moves[1:] + moves[:1], strict=True):
            for package in one_move_packages(str(action), text):
                honest += 1
                read, reason = read_move(extract_moves(f"<move>{package}</move>"), lookup)
                if read != action or reason:
                    misread.append((case, package, read))
            for package in two_move_packages(str(action), text, str(other), other_text):
                hedges += 1
                assert match_move(package, lookup) is None, (case, package)
        unknown = str(max(lookup.values()) + 1000)
        for package in (unknown, f"{unknown}.", f"Move: {unknown}", f'{{"id": {unknown}}}'):
            assert match_move(package, lookup) is None, (case, package)
    assert honest / 27 == hedges / 15 >= 2 * len(PACKAGE_CASES)  # every form of every move
    false_negative_rate = len(misread) / honest
    assert false_negative_rate == 0.0, misread[:10]
