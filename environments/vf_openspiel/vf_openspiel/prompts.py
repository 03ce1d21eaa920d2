"""Prompt text. Only strings are built here; the game logic lives in session.py."""

from __future__ import annotations

from .cases import short_name
from .session import GameSession

SYSTEM_PROMPT = (
    "You are playing a board or card game against an opponent. Each turn you are shown the game "
    "from your point of view and the list of your legal moves as `id: move`. Answer with one "
    "legal move inside <move></move> tags, written as its id or its exact text, for example "
    "<move>12</move>. Only your last <move> tag is read; reasoning outside it is ignored. A reply "
    "without a <move> tag, with tags naming different moves, or with a move that is not in the "
    "list, is an illegal move."
)

# Names of the seats, checked against open_spiel 2.0.2 (e.g. chess player 1 moves first: White).
SEAT_LABELS: dict[str, tuple[str, ...]] = {
    "chess": ("Black", "White"),
    "go": ("Black, X", "White, O"),
    "othello": ("Black, x", "White, o"),
    "hex": ("x", "o"),
    "tic_tac_toe": ("x", "o"),
    "connect_four": ("x", "o"),
    "breakthrough": ("b", "w"),
    "clobber": ("o", "x"),
    "checkers": ("o", "+"),
}

# Keys to the terse state strings of some games (from open_spiel's sources).
GAME_NOTES: dict[str, str] = {
    "hex": "x joins row 1 to the last row, o joins column a to the last column.",
    "kuhn_poker": "Your view is your card (0=Jack, 1=Queen, 2=King) then the betting so far "
    "(p=pass, b=bet).",
    "leduc_poker": "Cards 0-1 are Jacks, 2-3 Queens, 4-5 Kings. Betting rounds list actions as "
    "0=Fold, 1=Call, 2=Raise. Pairing the public card beats any unpaired hand.",
    "liars_dice": "Your view is your die (or dice) then the bids so far as quantity-face; "
    "'Liar' challenges the last bid.",
}


def seat_text(case: str, seat: int, num_players: int) -> str:
    label = SEAT_LABELS.get(short_name(case), ())
    name = f" ({label[seat]})" if seat < len(label) else ""
    return f"player {seat}{name} of {num_players}"


def legal_moves_text(session: GameSession) -> str:
    return "\n".join(f"{action}: {text}" for action, text in session.legal_moves())


def position_text(session: GameSession) -> str:
    """The model's view and its legal moves: the body of every turn message."""
    return (
        f"Your view:\n{session.view()}\n\n"
        f"Your legal moves (id: move):\n{legal_moves_text(session)}\n\n"
        "Reply with one move inside <move></move>."
    )


MOVE_MODE_NOTE = "You make one move; the game is then played out automatically to score it."


def opening_text(case: str, session: GameSession, mode: str) -> str:
    """First user message: the game, the model's seat, notes on its notation, the position."""
    seat = seat_text(case, session.seat, session.game.num_players())
    lines = [f"Game: {session.game.get_type().long_name} ({case}). You are {seat}."]
    note = GAME_NOTES.get(short_name(case))
    if note:
        lines.append(note)
    if mode == "move":
        lines.append(MOVE_MODE_NOTE)
    return "\n".join(lines) + "\n\n" + position_text(session)


def turn_text(played: str, events: list[str], session: GameSession) -> str:
    """After a legal model move that did not end the game."""
    return "\n".join([f"You played {played}.", *events]) + "\n\n" + position_text(session)


def illegal_text(reason: str, left: int, session: GameSession) -> str:
    return (
        f"Illegal move: {reason}. {left} more illegal repl{'y' if left == 1 else 'ies'} "
        "and you lose the game.\n\n" + position_text(session)
    )
