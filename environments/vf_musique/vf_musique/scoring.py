"""Answer and evidence scores: SQuAD-normalised exact match and token F1, set precision/recall.

These are the official MuSiQue/SQuAD definitions, so numbers are comparable with published
results. The predicted answer is always compared as one string: it is never split into
candidates, so listing several guesses lowers F1 instead of winning it.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD v1.1)."""
    text = text.lower().translate(_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when both normalise to the same string."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after normalisation."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(metric, prediction: str | None, golds: Iterable[str]) -> float:
    """Best score of `prediction` against the answer and its aliases; 0 for no/empty answer."""
    if prediction is None or not normalize_answer(prediction):
        return 0.0
    return max((metric(prediction, gold) for gold in golds), default=0.0)


def precision_recall(
    predicted: set[int], gold: set[int], credited: set[int] | None = None
) -> tuple[float, float]:
    """Set precision and recall; an empty gold set is fully recalled, and only an empty
    prediction is precise against it (so citing documents for nothing still costs). With
    `credited`, only predictions in it can be hits (a citation of a paragraph never shown)."""
    hits = len(predicted & gold & (predicted if credited is None else credited))
    recall = hits / len(gold) if gold else 1.0
    if predicted:
        precision = hits / len(predicted)
    else:
        precision = 0.0 if gold else 1.0
    return precision, recall


def f_score(precision: float, recall: float) -> float:
    """Harmonic mean, 0 when both are 0."""
    total = precision + recall
    return 2 * precision * recall / total if total else 0.0
