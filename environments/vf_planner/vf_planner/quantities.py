"""Which quantity a question asks for, and which quantity a solution line computes.

A subproblem that holds the whole problem counts only when its own question names the step it
computed (steps.names_step). "Names" is read as a careful grader reads it, one quantity per
subproblem:

- the question's asked quantity is the noun phrase after its asking words ("how many", "how
  much", "what is the", "find the", "which"), after "number of" / "amount of" / "value of" when
  the head is such a generic noun ("Let x be the number of spoons. Find x." asks for spoons),
  or, for "How much does she make every day?", the words of its predicate; after a colon
  ("the value of: He spends minutes digging small holes") the whole description;
- a head that is only a generic noun ("Which quantity about ...", "the first quantity you need
  to compute", "the value before the final step") names no quantity: the worker chose it; a
  run of more than four content words without a verb or preposition ("How many <the problem's
  words> are there?") is a list, not a noun phrase;
- the step's quantity is the noun phrase the solution line attaches to that step's result
  ("He spends 3*30=<<3*30=90>>90 minutes digging small holes": minutes digging small holes,
  with "He spends"), money when the result is in dollars;
- the asked quantity names the step when it shares a word with the step's quantity (or its
  kind: "How much money is that, in dollars?" for a result in dollars), at least half of its
  words are words of the step's line, and none of them is a word that only another step's
  quantity has: a list of the problem's or the solution's words names every quantity at once,
  which is naming none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vf_planner.answers import numbers_in
from vf_planner.notation import mask_numbers

# Words that name no particular quantity of a problem: what generic probes are made of.
GENERIC_WORDS = frozenset(
    """what which when where does will would that this these those there their them then than
    with from have into your much many more less each every first second third fourth fifth
    last final next quantity quantities value values number numbers result results answer
    answers step steps compute computed calculate calculated need needs needed find work worked
    reply only just give given before after solve solved problem subproblem part total amount
    time times figure state states stated starting start finish version changed change
    the and are was has had his her its for but not you she him how why who any all can did
    got get per off out own let""".split()
)
# Nouns that are a quantity's placeholder, not its name: named only through "of ..."
# ("the number of spoons") or a description after a colon.
_PLACEHOLDERS = frozenset(
    "quantity quantities value values number numbers amount amounts result results answer "
    "answers figure figures thing things total totals".split()
)
# Words that end the noun phrase a question asks for: verbs that ask, pronouns, prepositions
# other than "of", conjunctions, punctuation (handled apart).
_BOUNDARY = frozenset(
    """is are was were be been being do does did will would can could should shall may might
    must has have had he she it they we you i him her them us his its their our your there
    that which who whom whose when where while if because since so then than as about for
    from in on at by to into onto over under after before during per with without between
    among and or but first""".split()
)
_DETERMINERS = frozenset(
    "the a an this that these those first second third fourth fifth next last final initial "
    "same his her its their our your my".split()
)
NOUN_PHRASE_WORDS = 4
"""The most content words a noun phrase that names one quantity has ("the number of minutes
digging small holes" has four); a longer run without a verb or a preposition is a list."""
_ASKING = re.compile(
    r"\bhow\s+(?:many|much|long|far)\b|\bwhat\b|\bwhich\b|\bfind\b|\bcompute\b|\bcalculate\b"
    r"|\bdetermine\b|\bwork\s+out\b",
    re.IGNORECASE,
)
# "Find x." / "What is x?" / "Solve for x": a question that asks for a variable it defined.
_ASKS_VARIABLE = re.compile(
    r"^\W*(?:find|compute|calculate|determine|solve\s+for|what\s+is|give)\s+(?P<name>[a-z])\W*$",
    re.IGNORECASE,
)
# Kinds of quantity a question may name without the line's own words.
_UNITS = {"money": frozenset("money dollar dollars cent cents cost costs price prices".split())}


def stem(word: str) -> str:
    """A word's lower-case singular stem ("glasses" -> "glass", "berries" -> "berry")."""
    word = word.lower()
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if re.search(r"(?:ss|x|ch|sh)es$", word):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """The words of `text` that can name a quantity ("eggs", "pay", "cup"): stems of words of
    three letters or more, without numbers, function words and generic words."""
    words = re.findall(r"[a-z]+", mask_numbers(text).lower())
    return {stem(w) for w in words if len(w) > 2 and w not in GENERIC_WORDS}


def _kinds(words: set[str]) -> set[str]:
    """The kinds of quantity `words` name ("money" for "dollars", "cost", "price")."""
    return {kind for kind, names in _UNITS.items() if words & {stem(n) for n in names}}


def sentences(text: str) -> list[str]:
    """The sentences of `text`, split after ".", "?" and "!"."""
    return [s for s in re.split(r"(?<=[.?!])\s+", text.strip()) if s]


def own_question(text: str) -> str:
    """The question a text asks: its last sentence that asks (ends with "?", or asks for a
    variable: "Find x."), else its last sentence; a question that asks for a variable is the
    variable's definition ("Let x be the number of spoons")."""
    said = sentences(text)
    asked = [s for s in said if s.endswith("?") or _ASKS_VARIABLE.match(s)]
    question = (asked or said or [""])[-1]
    variable = _ASKS_VARIABLE.match(question)
    if variable is None:
        return question
    name = re.escape(variable.group("name"))
    definition = re.compile(
        rf"\b(?:let\s+{name}\s+(?:be|denote|represent|stand\s+for)|{name}\s*(?:=|is))\s+"
        r"(?P<phrase>[^.?!;]+)",
        re.IGNORECASE,
    )
    defined = [m.group("phrase") for s in said if (m := definition.search(s))]
    return f"What is {defined[-1]}?" if defined else question


def asked_words(question: str) -> set[str] | None:
    """The words of the quantity `question` asks for (module docstring); None when it asks for
    no particular quantity (a placeholder such as "the first quantity" with nothing after)."""
    asking = _ASKING.search(question)
    rest = question[asking.end() :] if asking else question
    if ":" in rest:  # "the value of: <description>": the description names it
        return content_words(rest.partition(":")[2])
    words = re.findall(r"[A-Za-z][\w'-]*|[^\w\s]", rest)
    while words and words[0].lower() in _DETERMINERS | {"is", "are", "was", "were"}:
        words.pop(0)
    phrase: list[str] = []
    for word in words:
        low = word.lower()
        if low == "of" and phrase and all(w.lower() in _PLACEHOLDERS for w in phrase):
            phrase = []  # "number of spoons": the spoons are what it names
            continue
        if low in _BOUNDARY or not word[0].isalpha():
            break
        if low not in _DETERMINERS:
            phrase.append(word)
    if phrase and all(w.lower() in _PLACEHOLDERS for w in phrase):
        return None  # "which quantity about ...", "the value before the final step"
    named = content_words(" ".join(phrase))
    if len(named) > NOUN_PHRASE_WORDS:
        return None  # "How many <the problem's words> are there?": a list, not a quantity
    return named or content_words(rest)  # "How much does she make every day?": the predicate


@dataclass(frozen=True)
class StepQuantity:
    """What a solution line says one of its steps computes: the words of the noun phrase at its
    result (with the clause that leads to it), the kinds of quantity it is, and the line's
    words."""

    words: frozenset[str]
    kinds: frozenset[str]
    line: frozenset[str]


_CALCULATION = re.compile(r"<<[^<>=]*=(?P<result>[^<>]*)>>")
# Where the clause that leads to a result starts, and where the noun phrase after it ends.
_CLAUSE = re.compile(
    r"[,;:.!?()]|\b(?:so|then|thus|which|who|when|because|since|if|while)\b", re.IGNORECASE
)
_PHRASE_END = re.compile(rf"{_CLAUSE.pattern}|\b(?:and|but|or)\b", re.IGNORECASE)
# The expression a solution writes before its annotation ("3*30=", "80,000+50,000=$").
_EXPRESSION = re.compile(r"[\d\s.,+\-*/x×÷()=$%]*$")
# The result a solution writes after its annotation ("90", "$130,000", "4 (15").
_RESULT = re.compile(r"^\s*\$?\s*[\d,]*\.?\d*\s*%?")


def step_quantities(line: str) -> list[StepQuantity]:
    """The quantity each calculator step of a solution line computes, in order."""
    found = []
    plain = _CALCULATION.sub(" ", line)
    every = content_words(plain)
    for match in _CALCULATION.finditer(line):
        if not numbers_in(match.group("result")):
            continue  # no step (calculator_steps skips it too)
        before = _EXPRESSION.sub("", line[: match.start()])
        lead = _CLAUSE.split(before)[-1]
        after = line[match.end() :]
        result = _RESULT.match(after)
        tail = after[result.end() :] if result else after
        noun = _PHRASE_END.split(tail.lstrip("( "), maxsplit=1)[0]
        # a result written after its reason ("... because 18 / 2 = 9"): the line names it
        words = content_words(f"{lead} {noun}") or every
        money = "$" in line[max(match.start() - 2, 0) : match.end() + 2] or bool(
            re.match(r"\s*(?:dollars?|cents?)\b", noun, re.IGNORECASE)
        )
        kinds = _kinds(words) | ({"money"} if money else set())
        found.append(StepQuantity(frozenset(words), frozenset(kinds), frozenset(every)))
    return found


def names_quantity(asked: set[str], step: StepQuantity, others: set[str]) -> bool:
    """Whether the asked words name the step's quantity and no other (module docstring):
    they share a word or a kind with it, at least half of them are words of its line, and none
    is a word only another step's quantity has (`others`)."""
    of_kind = {w for w in asked if _kinds({w}) & step.kinds}
    shares = bool(asked & step.words or of_kind)
    in_line = asked & (step.line | step.words) | of_kind
    foreign = asked & (others - step.line)
    return shares and 2 * len(in_line) >= len(asked) and not foreign
