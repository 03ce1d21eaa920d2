"""A seeded grammar of the wrappers real models write around the one answer they commit to.

Written from the wrappers models are seen to write (issue 58), never from the rubric's rules:
a reply is the committed answer (the gold, or on a MuSiQue-Full row a refusal) composed with
one value of each wrapper family, drawn by a seeded generator:

- answer form: the gold as written, a measure's unit abbreviated ("6.8 in" for "6.8 inches"),
  a name's diacritics dropped ("Bjork" for "Björk");
- casing; markup around the answer (bold, code, quotes); a step chain ("B → X");
- a citation in any bracket layout ("X [6][14][15]", "X (Doc 6, 14)", "X [6, 14]");
- a hedge or confidence words ("Probably X", "It seems to be X.", "X (confidence: high)");
- an announcement anywhere in the sentence ("According to Document 10, the answer is X.",
  "Since the earlier hop is B, the answer is X.", "<a sentence>. Final answer: X");
- a label ("Answer: X"); a container ("1. X", "- X", '{"answer": "X"}', "answer: X");
- trailing punctuation.

Refusals compose a phrasing ("N/A", "Cannot be determined from the documents") with a reason
(the missing hop: "no document says who founded Routledge") and a found entity (the hop
before the gap: "I found Routledge, but nothing about ..."). Two-candidate replies name a
second candidate ("X or Y", "X (or possibly Y)") or guess beside a refusal ("Unanswerable, but
probably X"): none may pay more than committing to one of the two at random.

The rows are the answerable rows of the shared MuSiQue files that `held_out` keeps (a seeded
half, about 100 rows: the reading was designed on the other half), and rows made from them
whose gold is a measure or a name with diacritics their own documents write (`with_gold`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .musique_corpus import RELATION_WORDS, sub_questions, with_gold

Row = dict[str, Any]
MAX_WORDS = 20  # submit_answer refuses a longer answer: no such reply is ever scored
NONE = "none"


@dataclass(frozen=True)
class Composition:
    """One reply and the wrapper (family -> value) that made it; NONE for a family left out."""

    reply: str
    families: dict[str, str] = field(default_factory=dict)

    def wrapped_by(self) -> list[tuple[str, str]]:
        """The (family, value) pairs this reply was wrapped in."""
        return [(f, v) for f, v in self.families.items() if v != NONE]


def _seed(*parts: object) -> int:
    return int(hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:12], 16)


def held_out(rows: list[Row], salt: str = "issue 58") -> list[Row]:
    """The seeded half of `rows` kept for measuring (about 100 of the 200 answerable rows)."""
    return [row for row in rows if _seed(salt, row["id"]) % 2 == 0]


def design_half(rows: list[Row], salt: str = "issue 58") -> list[Row]:
    """The other half: the rows the reading was designed on."""
    return [row for row in rows if _seed(salt, row["id"]) % 2 == 1]


# --- answer forms ------------------------------------------------------------------------------

# A unit written out and its abbreviation, as documents write measures.
UNIT_ABBREVIATIONS = {
    "inches": "in",
    "feet": "ft",
    "miles": "mi",
    "kilometres": "km",
    "kilometers": "km",
    "metres": "m",
    "meters": "m",
    "pounds": "lb",
    "kilograms": "kg",
    "centimetres": "cm",
    "centimeters": "cm",
    "millimetres": "mm",
    "square miles": "sq mi",
    "square kilometres": "sq km",
    "miles per hour": "mph",
    "hectares": "ha",
}
_MEASURE = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?) ("
    + "|".join(sorted(UNIT_ABBREVIATIONS, key=len, reverse=True))
    + r")\b"
)
_DIACRITIC_NAME = re.compile(
    r"\b[A-Z][^\W\d_]*[^\x00-\x7f][^\W\d_]*(?: [A-Z][^\W\d_]+){0,2}"
    r"|\b[A-Z][^\W\d_]+ [A-Z][^\W\d_]*[^\x00-\x7f][^\W\d_]*"
)
_FOLDED = str.maketrans({"ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "ß": "ss", "đ": "d", "ı": "i"})


def without_diacritics(text: str) -> str:
    """The text as typed on a keyboard without accents: "Björk" -> "Bjork"."""
    decomposed = unicodedata.normalize("NFKD", text.translate(_FOLDED))
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _first_in_documents(row: Row, pattern: re.Pattern[str]) -> str | None:
    paragraphs = sorted(row["paragraphs"], key=lambda p: not p["is_supporting"])
    for paragraph in paragraphs:
        for found in pattern.finditer(paragraph["paragraph_text"]):
            if pattern is _MEASURE or without_diacritics(found.group(0)) != found.group(0):
                return found.group(0)
    return None


def form_rows(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows made from `rows` whose gold is a measure with its unit written out ("6.8 inches")
    or a name with diacritics ("Kraków") that one of their documents writes."""
    out: dict[str, list[Row]] = {"unit abbreviated": [], "diacritics dropped": []}
    for row in rows:
        if (measure := _first_in_documents(row, _MEASURE)) is not None:
            out["unit abbreviated"].append(with_gold(row, measure, "measure"))
        if (name := _first_in_documents(row, _DIACRITIC_NAME)) is not None:
            out["diacritics dropped"].append(with_gold(row, name, "diacritics"))
    return out


def answer_form(gold: str, form: str) -> str:
    """The gold in `form` ("unit abbreviated", "diacritics dropped", or as written)."""
    if form == "unit abbreviated" and (found := _MEASURE.fullmatch(gold)):
        return f"{found.group(1)} {UNIT_ABBREVIATIONS[found.group(2)]}"
    if form == "diacritics dropped":
        return without_diacritics(gold)
    return gold


# --- wrapper families --------------------------------------------------------------------------

CASINGS: dict[str, Callable[[str], str]] = {
    NONE: lambda s: s,
    "lower case": str.lower,
    "upper case": str.upper,
    "title case": lambda s: " ".join(w[:1].upper() + w[1:] for w in s.split(" ")),
}
MARKUP = {
    NONE: "{}",
    "bold": "**{}**",
    "italics": "*{}*",
    "code": "`{}`",
    "double quotes": '"{}"',
    "single quotes": "'{}'",
    "curly quotes": "\u201c{}\u201d",
}
CHAINS = {
    NONE: None,
    "bridge → X": " \u2192 ",
    "bridge -> X": " -> ",
    "bridge => X": " => ",
    "every hop → X": " \u2192 ",
}


def _citation_layouts(ids: list[int]) -> dict[str, str]:
    a, b = (ids + ids)[:2] if ids else (6, 14)
    every = ids or [6, 14]
    return {
        NONE: "",
        "[6][14][15]": "".join(f"[{i}]" for i in every),
        "[6, 14]": f"[{', '.join(map(str, every))}]",
        "(Doc 6, 14)": f"(Doc {', '.join(map(str, every))})",
        "(Documents 6 and 14)": f"(Documents {a} and {b})",
        "[Document 6]": f"[Document {a}]",
        "(doc 6)": f"(doc {a})",
        "[Doc 6, Doc 14]": f"[{', '.join(f'Doc {i}' for i in every)}]",
        "(source: Document 6)": f"(source: Document {a})",
        "(see Documents 6, 14)": f"(see Documents {', '.join(map(str, every))})",
    }


# Hedges: `adverb` fits any slot, `clause` only where a clause may start, `suffix` after it.
HEDGES: dict[str, tuple[str, str]] = {
    NONE: ("adverb", "{}"),
    "probably": ("adverb", "probably {}"),
    "most likely": ("adverb", "most likely {}"),
    "likely": ("adverb", "likely {}"),
    "it seems to be": ("clause", "it seems to be {}"),
    "I believe the answer is": ("clause", "I believe the answer is {}"),
    "I think it is": ("clause", "I think it is {}"),
    "my best guess is": ("clause", "my best guess is {}"),
    "I am fairly confident it is": ("clause", "I am fairly confident it is {}"),
    "(confidence: high)": ("suffix", "{} (confidence: high)"),
    "(high confidence)": ("suffix", "{} (high confidence)"),
    "though not completely certain": ("suffix", "{}, though I am not completely certain"),
    "but I'm not 100% sure": ("suffix", "{}, but I'm not 100% sure"),
    "I think (after)": ("suffix", "{}, I think"),
}
# Announcements: `clause` takes a whole clause after it, `noun` only the answer.
ANNOUNCEMENTS: dict[str, tuple[str, str]] = {
    NONE: ("clause", "{}"),
    "the answer is": ("noun", "the answer is {}"),
    "according to Document d": ("noun", "according to Document {doc}, the answer is {}"),
    "based on the documents,": ("clause", "based on the documents, {}"),
    "since the earlier hop is B": ("noun", "since the earlier hop is {bridge}, the answer is {}"),
    "<a sentence>. Final answer:": ("noun", "{bridge} leads to the last hop. Final answer: {}"),
    "<reasoning>. Final answer:": ("noun", "I searched each hop in turn. Final answer: {}"),
    "so the final answer is": ("noun", "so the final answer is {}"),
    "after searching, I found that": ("noun", "after searching, I found that the answer is {}"),
    "therefore,": ("clause", "therefore, {}"),
    "putting the hops together:": ("clause", "putting the hops together: {}"),
}
LABELS = {
    NONE: "{}",
    "Answer:": "Answer: {}",
    "Final answer:": "Final answer: {}",
    "**Answer:**": "**Answer:** {}",
    "ANSWER:": "ANSWER: {}",
    "Final Answer -": "Final Answer - {}",
    "A:": "A: {}",
}
CONTAINERS: dict[str, Callable[[str], str]] = {
    NONE: lambda s: s,
    "numbered list": lambda s: f"1. {s}",
    "bullet": lambda s: f"- {s}",
    "asterisk bullet": lambda s: f"* {s}",
    "JSON": lambda s: json.dumps({"answer": s}),
    "JSON, final_answer": lambda s: json.dumps({"final_answer": s}, ensure_ascii=False),
    "YAML": lambda s: f"answer: {s}",
    "blockquote": lambda s: f"> {s}",
}
SUFFIXES = {NONE: "", "full stop": ".", "exclamation": "!", "ellipsis": "...", "spaced stop": " ."}
WHOLE_CASINGS = {NONE: lambda s: s, "whole reply lower case": str.lower}

ANSWER_FAMILIES = (
    "casing",
    "markup",
    "chain",
    "citation",
    "hedge",
    "announcement",
    "label",
    "container",
    "suffix",
    "whole casing",
)


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:] if text[:1].isalpha() else text


def _fits(reply: str) -> bool:
    return 0 < len(reply.split()) <= MAX_WORDS and len(reply.splitlines()) == 1


def _bridges(row: Row) -> list[str]:
    return [step["answer"] for step in row["question_decomposition"][:-1]]


def compose(row: Row, core: str, choice: dict[str, str], cited: list[int]) -> str | None:
    """The reply that wraps `core` (the answer as committed) in `choice` (family -> value), or
    None where the values do not go together (a clause hedge after "the answer is")."""
    bridges = _bridges(row) or [row["question_decomposition"][0]["answer"]]
    text = MARKUP[choice["markup"]].format(CASINGS[choice["casing"]](core))
    if (arrow := CHAINS[choice["chain"]]) is not None:
        steps = bridges if choice["chain"].startswith("every") else bridges[-1:]
        text = arrow.join([*steps, text])
    layout = _citation_layouts(cited)[choice["citation"]]
    hedge_slot, hedge = HEDGES[choice["hedge"]]
    slot, announcement = ANNOUNCEMENTS[choice["announcement"]]
    if hedge_slot == "clause" and slot == "noun":
        return None
    if hedge_slot == "suffix":
        text = hedge.format(f"{text} {layout}".strip())
    else:
        text = f"{hedge.format(text)} {layout}".strip()
    text = announcement.format(text, doc=(cited or [10])[0], bridge=bridges[-1])
    text = _capitalised(text) + SUFFIXES[choice["suffix"]]
    text = LABELS[choice["label"]].format(text)
    text = CONTAINERS[choice["container"]](text)
    return WHOLE_CASINGS[choice["whole casing"]](text)


_OPTIONS: dict[str, list[str]] = {
    "casing": list(CASINGS),
    "markup": list(MARKUP),
    "chain": list(CHAINS),
    "citation": list(_citation_layouts([])),
    "hedge": list(HEDGES),
    "announcement": list(ANNOUNCEMENTS),
    "label": list(LABELS),
    "container": list(CONTAINERS),
    "suffix": list(SUFFIXES),
    "whole casing": list(WHOLE_CASINGS),
}


def _draw(rng: random.Random, families: tuple[str, ...], keep: float = 0.5) -> dict[str, str]:
    """One value per family: NONE with probability 1 - `keep`, else one of the others."""
    return {f: rng.choice(_OPTIONS[f][1:]) if rng.random() < keep else NONE for f in families}


def honest_compositions(
    row: Row, cited: list[int], n: int, form: str = NONE, seed: int = 0
) -> list[Composition]:
    """`n` seeded replies that commit to the row's gold (in answer `form`), each wrapped in a
    draw of every wrapper family (`ANSWER_FAMILIES`) that fits in 20 words."""
    rng = random.Random(_seed(seed, row["id"], form))
    core = answer_form(row["answer"], form)
    out: list[Composition] = []
    for _ in range(50 * n):
        if len(out) == n:
            break
        choice = _draw(rng, ANSWER_FAMILIES)
        if not _bridges(row) and choice["chain"] != NONE:
            choice["chain"] = NONE
        reply = compose(row, core, choice, cited)
        if reply is not None and _fits(reply) and reply not in {c.reply for c in out}:
            out.append(Composition(reply, {"answer form": form, **choice}))
    return out


def single_wrapper_compositions(
    row: Row, cited: list[int], form: str = NONE, seed: int = 0
) -> list[Composition]:
    """Each family on its own: for the gold as written, one seeded reply per wrapper family
    with that family alone (a value drawn at random); for another answer `form`, the form
    bare. So each family's false-negative rate is measured alone as well as composed."""
    none = {f: NONE for f in ANSWER_FAMILIES}
    if form != NONE:
        return [Composition(answer_form(row["answer"], form), {"answer form": form, **none})]
    rng = random.Random(_seed("alone", seed, row["id"]))
    out = []
    for family in ANSWER_FAMILIES:
        if family == "chain" and not _bridges(row):
            continue
        for _ in range(20):
            choice = none | {family: rng.choice(_OPTIONS[family][1:])}
            reply = compose(row, row["answer"], choice, cited)
            if reply is not None and _fits(reply):
                out.append(Composition(reply, {"answer form": form, **choice}))
                break
    return out


# --- refusals ----------------------------------------------------------------------------------

REFUSAL_PHRASINGS = {
    "unanswerable": "Unanswerable",
    "N/A": "N/A",
    "not possible with the given documents": (
        "It is not possible to answer this question with the given documents"
    ),
    "cannot be determined from the documents": "Cannot be determined from the documents",
    "not answerable": "Not answerable",
    "I cannot answer": "I cannot answer this from the documents",
    "insufficient information": "Insufficient information",
    "the question cannot be answered": "The question cannot be answered",
    "unknown": "Unknown",
}


def _missing_hop(row: Row, missing: int) -> tuple[str, str]:
    """(the missing hop as a clause, "who founded Routledge"; as a thing, "the founder of
    Routledge"), its earlier answers filled in."""
    question = sub_questions(row)[missing].strip().rstrip("?").strip()
    if ">>" in question:
        subject, relation = (part.strip() for part in question.split(">>", 1))
        thing = RELATION_WORDS.get(relation, relation).split()[0]
        return f"what the {thing} of {subject} is", f"the {thing} of {subject}"
    clause = question[:1].lower() + question[1:]
    if not re.match(r"(?i)^(who|what|when|where|which|how|why|whose|whom)\b", clause):
        clause = f"what {clause}"
    return clause, clause


def _found_entity(row: Row, missing: int) -> str:
    """What an honest agent found before the gap: the answer of the hop before it, else the
    missing hop's subject (or the title of a supporting paragraph)."""
    steps = row["question_decomposition"]
    if missing > 0:
        return steps[missing - 1]["answer"]
    question = steps[0]["question"]
    if ">>" in question:
        return question.split(">>", 1)[0].strip()
    titles = [p["title"] for p in row["paragraphs"] if p["is_supporting"]]
    return (titles or [row["paragraphs"][0]["title"]])[0]


def refusal_reasons(row: Row, missing: int) -> dict[str, str]:
    """Reasons that name the missing hop, as sentence parts."""
    clause, thing = _missing_hop(row, missing)
    return {
        NONE: "",
        "no document says": f"no document says {clause}",
        "the documents do not say": f"the documents do not say {clause}",
        "nothing about": f"there is nothing about {thing} in the documents",
        "none of the documents mention": f"none of the documents mention {thing}",
        "I could not find": f"I could not find {thing}",
    }


FOUND = {
    NONE: "",
    "I found B, but nothing about": "I found {found}, but nothing about {thing}",
    "the documents identify B, but not": "the documents identify {found}, but not {thing}",
    "I could identify B but not": "I could identify {found} but not {thing}",
    "B is mentioned, but": "{found} is mentioned, but the documents do not say {clause}",
}
JOINS = {
    "phrasing: reason": "{phrasing}: {reason}.",
    "phrasing. reason": "{phrasing}. {reason}.",
    "phrasing - reason": "{phrasing} - {reason}",
    "phrasing (reason)": "{phrasing} ({reason})",
    "reason, so phrasing": "{reason}, so {phrasing_lower}.",
}
REFUSAL_FAMILIES = ("label", "container", "suffix", "whole casing", "markup", "citation")


def refusal_compositions(row: Row, missing: int, cited: list[int], n: int) -> list[Composition]:
    """`n` seeded refusals for a row whose hop `missing` is gone: phrasing x reason x found
    entity x join, some wrapped in a label, container, markup, citation or casing."""
    rng = random.Random(_seed("refusal", row["id"], missing))
    reasons = refusal_reasons(row, missing)
    clause, thing = _missing_hop(row, missing)
    found = _found_entity(row, missing)
    out: list[Composition] = []
    for _ in range(50 * n):
        if len(out) == n:
            break
        choice = {
            "phrasing": rng.choice(list(REFUSAL_PHRASINGS)),
            "reason": rng.choice(list(reasons)),
            "found entity": rng.choice(list(FOUND)),
            "join": rng.choice(list(JOINS)),
            **_draw(rng, REFUSAL_FAMILIES, keep=0.3),
        }
        phrasing = REFUSAL_PHRASINGS[choice["phrasing"]]
        found_part = FOUND[choice["found entity"]].format(found=found, thing=thing, clause=clause)
        reason = "; ".join(p for p in (found_part, reasons[choice["reason"]]) if p)
        if reason:
            text = JOINS[choice["join"]].format(
                phrasing=phrasing, phrasing_lower=phrasing[:1].lower() + phrasing[1:], reason=reason
            )
        else:
            text, choice["join"] = phrasing, NONE
        text = _capitalised(MARKUP[choice["markup"]].format(text) if not reason else text)
        if layout := _citation_layouts(cited)[choice["citation"]]:
            text = f"{text.rstrip('.')} {layout}"
        text = LABELS[choice["label"]].format(text.rstrip(".") + SUFFIXES[choice["suffix"]])
        text = WHOLE_CASINGS[choice["whole casing"]](CONTAINERS[choice["container"]](text))
        if _fits(text) and text not in {c.reply for c in out}:
            out.append(Composition(text, choice))
    return out


# --- two candidates ----------------------------------------------------------------------------

TWO_CANDIDATES = {
    "X or Y": "{x} or {y}",
    "either X or Y": "either {x} or {y}",
    "X; alternatively Y": "{x}; alternatively {y}",
    "X (or possibly Y)": "{x} (or possibly {y})",
    "X or possibly Y": "{x} or possibly {y}",
    "X, maybe Y": "{x}, maybe {y}",
}
REFUSAL_GUESSES = {
    "Unanswerable, but probably X": "Unanswerable, but probably {x}",
    "N/A (maybe X)": "N/A (maybe {x})",
    "cannot be determined; my best guess is X": "Cannot be determined; my best guess is {x}",
    "unanswerable. The answer is probably X": "Unanswerable. The answer is probably {x}",
    "not in the documents, though it might be X": (
        "The documents do not say, though it might be {x}"
    ),
    "I could not find it, so I guess X": "I could not find it, so I guess {x}",
    "probably unanswerable. The answer is X": "Probably unanswerable. The answer is {x}",
    "unanswerable but the answer is probably X": "Unanswerable but the answer is probably {x}",
    "N/A; if I had to guess, X": "N/A; if I had to guess, {x}",
    "I could not find it. My best guess: X": "I could not find it. My best guess: {x}",
    "X. Unanswerable.": "{x}. Unanswerable.",
}
_TWO_WRAPPERS = ("label", "container", "announcement", "citation", "suffix")


def two_candidate_compositions(
    row: Row, x: str, y: str, cited: list[int], forms: dict[str, str] = TWO_CANDIDATES
) -> list[Composition]:
    """Every form of `forms` naming `x` and `y` (a refusal guess uses `x` only), bare and in
    one seeded draw of the label, container, announcement, citation and suffix families."""
    rng = random.Random(_seed("two", row["id"], x, y))
    out = []
    for style, form in forms.items():
        core = form.format(x=x, y=y)
        out.append(Composition(core, {"form": style}))
        for _ in range(20):
            choice = {
                **{f: NONE for f in ANSWER_FAMILIES},
                **_draw(rng, _TWO_WRAPPERS, keep=0.6),
            }
            reply = compose(row, core, choice, cited)
            if reply is not None and _fits(reply):
                out.append(Composition(reply, {"form": style, **choice}))
                break
    return out


# --- the rollout a reply is scored in ----------------------------------------------------------


def decomposition_rollout(row: Row, answer: str) -> list[dict[str, Any]]:
    """The gold decomposition agent's rollout as saved results hold it (dict messages): one
    search per hop (its sub-question), each showing that hop's supporting paragraph where the
    row keeps one, then `answer` submitted citing every paragraph shown. The rubric reads the
    same facts from it as from a rollout through the loop (shown, cited, searched)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["question"]}]
    shown: list[int] = []
    for k, (step, query) in enumerate(
        zip(row["question_decomposition"], sub_questions(row), strict=True)
    ):
        support = step.get("paragraph_support_idx")
        call = {
            "id": f"r{k}",
            "name": "retrieve_documents",
            "arguments": json.dumps({"query": query}),
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        blocks = []
        if support is not None:
            paragraph = next(p for p in row["paragraphs"] if p["idx"] == support)
            blocks.append(f"Document ID: {support}\nTitle: {paragraph['title']}\nText: ...")
            shown.append(support)
        messages.append({"role": "tool", "tool_call_id": f"r{k}", "content": "\n\n".join(blocks)})
    args = {"answer": answer, "cited_doc_ids": [str(i) for i in dict.fromkeys(shown)]}
    submit = {"id": "final", "name": "submit_answer", "arguments": json.dumps(args)}
    messages.append({"role": "assistant", "content": "", "tool_calls": [submit]})
    messages.append({"role": "tool", "tool_call_id": "final", "content": "Answer submitted."})
    return messages


def cited_ids(row: Row) -> list[int]:
    """The supporting paragraphs the decomposition rollout shows and cites."""
    steps = row["question_decomposition"]
    return list(
        dict.fromkeys(
            s["paragraph_support_idx"] for s in steps if s.get("paragraph_support_idx") is not None
        )
    )
