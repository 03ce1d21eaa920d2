"""Regions that hold a place: every country pycountry knows, and the subdivisions places are
commonly qualified by ("Pittsburgh, Pennsylvania", "Austin, Texas, USA"), as canonical words.

`answers` reads a qualifier after a gold ("Moscow, Russia") against these; which region may
qualify which gold is its rule (`answers._contains`), not this module's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from functools import cache
from typing import Any

import pycountry

from .notation import canonical_tokens

__all__ = ["Regions", "countries_named", "other_subdivisions", "regions"]

# Countries by the short names people write, where pycountry has only an official or a
# current name ("Russian Federation", "Türkiye"), or none (the Soviet Union).
_SHORT_COUNTRY_NAMES = {
    "Russia": "RU",
    "Syria": "SY",
    "Vietnam": "VN",
    "South Korea": "KR",
    "North Korea": "KP",
    "Laos": "LA",
    "Czech Republic": "CZ",
    "Macedonia": "MK",
    "Brunei": "BN",
    "Turkey": "TR",
    "Swaziland": "SZ",
    "Burma": "MM",
    "Cape Verde": "CV",
    "East Timor": "TL",
    "Palestine": "PS",
    "Ivory Coast": "CI",
    "Vatican": "VA",
    "Vatican City": "VA",
    "Holland": "NL",
    "USA": "US",
    "US": "US",
    "United States of America": "US",
    "America": "US",
    "UK": "GB",
    "Britain": "GB",
    "Great Britain": "GB",
    "Soviet Union": "SU",
    "USSR": "SU",
    "Yugoslavia": "YU",
    "Czechoslovakia": "CS",
    "East Germany": "DD",
    "West Germany": "DE",
}
# The subdivisions a place is commonly qualified by from general knowledge ("Pittsburgh,
# Pennsylvania"); any other subdivision qualifies a place where the documents write it so.
_QUALIFYING_SUBDIVISIONS = {
    "US": {"State", "District"},
    "CA": {"Province", "Territory"},
    "AU": {"State", "Territory"},
    "GB": {"Country", "Province"},
    "IN": {"State", "Union territory"},
}

Regions = Mapping[tuple[str, ...], frozenset[tuple[str, str]]]


def _country_names(country: Any) -> list[str]:
    """A country's names as pycountry gives them, and the short forms of the official ones
    ("Bolivia" for "Bolivia, Plurinational State of", "Falkland Islands" for "Falkland Islands
    (Malvinas)")."""
    names = [
        getattr(country, field, "") or "" for field in ("name", "common_name", "official_name")
    ]
    short = [re.split(r",|\(", name)[0].strip() for name in names if name]
    return [name for name in {*names, *short} if name]


@cache
def regions() -> Regions:
    """Countries (every one pycountry knows, current and historic, by any of its names and
    its three-letter code) and the subdivisions places are commonly qualified by, as
    canonical words -> {("country" | "subdivision", country code)}."""
    found: defaultdict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)

    def add(name: str, kind: str, code: str) -> None:
        if words := tuple(canonical_tokens(name)):
            found[words].add((kind, code))

    for country in pycountry.countries:
        for name in [*_country_names(country), country.alpha_3]:
            add(name, "country", country.alpha_2)
    for country in pycountry.historic_countries:
        for name in _country_names(country):
            add(name, "country", getattr(country, "alpha_2", "") or country.alpha_4)
    for name, code in _SHORT_COUNTRY_NAMES.items():
        add(name, "country", code)
    for region in pycountry.subdivisions:
        if region.type in _QUALIFYING_SUBDIVISIONS.get(region.country_code, ()):
            add(region.name.split("[")[0], "subdivision", region.country_code)
            if region.country_code == "US":  # postal abbreviations: "Pittsburgh, PA"
                add(region.code.split("-")[1], "subdivision", "US")
    return dict(found)


@cache
def other_subdivisions() -> Regions:
    """Every other subdivision pycountry knows (a Philippine province, an Italian region)."""
    found: defaultdict[tuple[str, ...], set[tuple[str, str]]] = defaultdict(set)
    for region in pycountry.subdivisions:
        if words := tuple(canonical_tokens(region.name.split("[")[0])):
            found[words].add(("subdivision", region.country_code))
    return dict(found)


def countries_named(gold: tuple[str, ...]) -> frozenset[tuple[str, ...]]:
    """The country names among the gold's words ("Alfredo Stroessner's Paraguay" names
    Paraguay): such a gold answers at the level of countries."""
    found = regions()
    return frozenset(
        gold[i:j]
        for i in range(len(gold))
        for j in range(i + 1, len(gold) + 1)
        if any(kind == "country" for kind, _ in found.get(gold[i:j], ()))
    )
