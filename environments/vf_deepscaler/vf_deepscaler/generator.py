"""Math problems the package writes itself, so the environment runs with no data at hand.

Each problem is built from its answer (pick the solution, then write the question), so every
answer is exact by construction. Row ``i`` comes from its own random stream seeded by
``(seed, stream, i)``: a seed always gives the same rows, and asking for more rows only extends
the list. Levels cycle 1..5 (easy to hard), so any prefix mixes difficulties.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from fractions import Fraction

Problem = tuple[str, Fraction | int]
"""A problem statement and its exact answer."""


def latex_number(value: Fraction | int) -> str:
    """Write an exact rational the way competition answers are written: ``7``, ``-\\frac{2}{3}``."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def linear_terms(terms: list[tuple[int, str]]) -> str:
    """Render ``[(3, "x"), (-1, "y"), (5, "")]`` as ``3x - y + 5`` (zero terms dropped)."""
    out = ""
    for coef, var in terms:
        if coef == 0:
            continue
        magnitude = "" if abs(coef) == 1 and var else str(abs(coef))
        if not out:
            out = f"{'-' if coef < 0 else ''}{magnitude}{var}"
        else:
            out += f" {'-' if coef < 0 else '+'} {magnitude}{var}"
    return out or "0"


def _nonzero(rng: random.Random, low: int, high: int) -> int:
    """A random integer in [low, high] other than 0."""
    return rng.choice([v for v in range(low, high + 1) if v != 0])


def _frac(value: Fraction) -> str:
    """A fraction inside a problem statement (always as ``\\frac``, even when it reduces)."""
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


# Level 1 -------------------------------------------------------------------------------------


def arithmetic(rng: random.Random) -> Problem:
    a, b, c = (rng.randint(10, 99) for _ in range(3))
    return f"Compute ${a} + {b} - {c}$.", a + b - c


def product(rng: random.Random) -> Problem:
    a, b = rng.randint(11, 99), rng.randint(2, 19)
    return f"Compute ${a} \\times {b}$.", a * b


# Level 2 -------------------------------------------------------------------------------------


def fraction_sum(rng: random.Random) -> Problem:
    x = Fraction(rng.randint(1, 11), rng.randint(2, 12))
    y = Fraction(rng.randint(1, 11), rng.randint(2, 12))
    op = rng.choice("+-")
    value = x + y if op == "+" else x - y
    return f"Compute ${_frac(x)} {op} {_frac(y)}$ as a reduced fraction.", value


def percent(rng: random.Random) -> Problem:
    p = rng.choice([5, 12, 15, 25, 35, 40, 45, 60, 75, 85])
    n = rng.randint(20, 400)
    return f"What is ${p}\\%$ of ${n}$?", Fraction(p * n, 100)


def order_of_operations(rng: random.Random) -> Problem:
    a, b, c, d = rng.randint(2, 30), rng.randint(2, 9), rng.randint(5, 15), rng.randint(1, 9)
    return f"Compute ${a} + {b} \\times ({c} - {d})^2$.", a + b * (c - d) ** 2


# Level 3 -------------------------------------------------------------------------------------


def linear_equation(rng: random.Random) -> Problem:
    a, c = rng.sample([v for v in range(-9, 10) if v != 0], 2)
    b, d = rng.randint(-20, 20), rng.randint(-20, 20)
    lhs, rhs = linear_terms([(a, "x"), (b, "")]), linear_terms([(c, "x"), (d, "")])
    return f"Solve for $x$: ${lhs} = {rhs}$.", Fraction(d - b, a - c)


def arithmetic_series(rng: random.Random) -> Problem:
    first, step, n = rng.randint(1, 20), rng.randint(2, 9), rng.randint(8, 40)
    seq = ", ".join(str(first + k * step) for k in range(3))
    text = f"What is the sum of the first ${n}$ terms of the arithmetic sequence ${seq}, \\ldots$?"
    return text, n * (2 * first + (n - 1) * step) // 2


# Level 4 -------------------------------------------------------------------------------------


def linear_system(rng: random.Random) -> Problem:
    x, y = _nonzero(rng, -9, 9), _nonzero(rng, -9, 9)
    while True:
        a1, b1, a2, b2 = (_nonzero(rng, -6, 6) for _ in range(4))
        if a1 * b2 != a2 * b1:
            break
    eq1 = f"{linear_terms([(a1, 'x'), (b1, 'y')])} = {a1 * x + b1 * y}"
    eq2 = f"{linear_terms([(a2, 'x'), (b2, 'y')])} = {a2 * x + b2 * y}"
    asked, value = rng.choice([("x + y", x + y), ("xy", x * y), ("x - y", x - y)])
    return f"If ${eq1}$ and ${eq2}$, what is the value of ${asked}$?", value


def quadratic_roots(rng: random.Random) -> Problem:
    r, s = rng.sample([v for v in range(-12, 13) if v != 0], 2)
    poly = linear_terms([(1, "x^2"), (-(r + s), "x"), (r * s, "")])
    asked, value = rng.choice(
        [("the larger root", max(r, s)), ("the sum of the squares of the roots", r * r + s * s)]
    )
    return f"The equation ${poly} = 0$ has two real roots. What is {asked}?", value


def gcd_lcm(rng: random.Random) -> Problem:
    g = rng.randint(2, 30)
    m, n = rng.sample([v for v in range(2, 40)], 2)
    a, b = g * m, g * n
    if rng.random() < 0.5:
        return f"What is the greatest common divisor of ${a}$ and ${b}$?", math.gcd(a, b)
    return f"What is the least common multiple of ${a}$ and ${b}$?", math.lcm(a, b)


# Level 5 -------------------------------------------------------------------------------------


def modular_power(rng: random.Random) -> Problem:
    a, b, m = rng.randint(2, 19), rng.randint(20, 300), rng.randint(7, 97)
    return f"What is the remainder when ${a}^{{{b}}}$ is divided by ${m}$?", pow(a, b, m)


def divisor_count(rng: random.Random) -> Problem:
    exponents = [rng.randint(0, 5), rng.randint(0, 3), rng.randint(0, 2), rng.randint(1, 2)]
    n = math.prod(p**e for p, e in zip((2, 3, 5, 7), exponents, strict=True))
    return f"How many positive divisors does ${n}$ have?", math.prod(e + 1 for e in exponents)


def committee(rng: random.Random) -> Problem:
    n = rng.randint(7, 20)
    k = rng.randint(2, n - 2)
    text = f"In how many ways can a committee of ${k}$ people be chosen from ${n}$ people?"
    return text, math.comb(n, k)


def dice_probability(rng: random.Random) -> Problem:
    total = rng.randint(3, 11)
    ways = sum(1 for i in range(1, 7) for j in range(1, 7) if i + j == total)
    text = (
        f"Two fair six-sided dice are rolled. What is the probability that the sum of the "
        f"numbers shown is ${total}$? Express your answer as a common fraction."
    )
    return text, Fraction(ways, 36)


LEVELS: dict[int, list[Callable[[random.Random], Problem]]] = {
    1: [arithmetic, product],
    2: [fraction_sum, percent, order_of_operations],
    3: [linear_equation, arithmetic_series],
    4: [linear_system, quadratic_roots, gcd_lcm],
    5: [modular_power, divisor_count, committee, dice_probability],
}


def generate_problems(n: int, seed: int = 0, stream: str = "train") -> list[dict[str, object]]:
    """``n`` rows of ``{"problem", "answer", "kind", "level"}``, deterministic in (seed, stream)."""
    rows: list[dict[str, object]] = []
    for i in range(n):
        rng = random.Random(f"vf_deepscaler:{seed}:{stream}:{i}")
        level = 1 + i % len(LEVELS)
        make = rng.choice(LEVELS[level])
        text, answer = make(rng)
        rows.append(
            {"problem": text, "answer": latex_number(answer), "kind": make.__name__, "level": level}
        )
    return rows
