"""Retrieval benchmark for vf-musique on the 200 MuSiQue dev rows.

Latency: the cost of one `retrieve_documents` call (cache lookup + ranking + formatting) for each
retriever with the per-question index already built, against the seed system's way of building a
rank-bm25 index over the question's paragraphs on every call, measured in the same run; plus the
one-off per-question build costs and rank-bm25 with a cached index (why bm25s was chosen).

Quality: supporting-paragraph recall@2 and @5 per retriever, querying (a) with each decomposition
sub-question (`#k` replaced by step k's answer; a hop counts as found when its own supporting
paragraph is in that query's top k) and (b) with the question alone (share of the question's
supporting paragraphs in its top k).

    .venv/bin/python bench/retrieval.py [--data PATH] [--rows 200] [--semantic-calls 200]
                                        [--out PATH]

Prints two tables and saves them as JSON to --out (default bench/results/retrieval.json).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rank_bm25 import BM25Okapi
from vf_musique.dataset import to_example
from vf_musique.retrieval import (
    RETRIEVERS,
    IndexCache,
    QuestionIndex,
    format_documents,
    index_from_info,
    index_key,
    reciprocal_rank_fusion,
    tokenize,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_path, save, summary  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "musique" / "dev_sample.jsonl"
TOP_N = 3  # the tool's default
KS = (2, 5)
ToolCall = Callable[[dict[str, Any], str], str]  # (row info, query) -> tool output


def load_rows(path: Path, n_rows: int) -> list[dict[str, Any]]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines[:n_rows]]


def sub_questions(row: dict[str, Any]) -> list[str]:
    """Decomposition steps with `#k` replaced by step k's answer (higher k first: #12 vs #1)."""
    steps = row["question_decomposition"]
    queries = []
    for step in steps:
        query = step["question"]
        for k in range(len(steps), 0, -1):
            query = query.replace(f"#{k}", steps[k - 1]["answer"])
        queries.append(query)
    return queries


def time_calls(fn: ToolCall, calls: list[tuple[dict, str]]) -> list[float]:
    """Wall time of each call, after two warm-up calls."""
    for info, query in calls[:2]:
        fn(info, query)
    times = []
    for info, query in calls:
        start = time.perf_counter()
        fn(info, query)
        times.append(time.perf_counter() - start)
    return times


def seed_style_call(info: dict[str, Any], query: str) -> str:
    """The seed system's tool: build a rank-bm25 index over the paragraphs on every call."""
    paragraphs = info["paragraphs"]
    bm25 = BM25Okapi([tokenize(f"{p['title']} {p['text']}") for p in paragraphs])
    order = np.argsort(-bm25.get_scores(tokenize(query)), kind="stable")[:TOP_N]
    return "\n\n".join(
        f"Document ID: {paragraphs[i]['idx']}\nTitle: {paragraphs[i]['title']}\n"
        f"Text: {paragraphs[i]['text']}"
        for i in order
    )


def rank_bm25_cached(infos: list[dict[str, Any]]) -> ToolCall:
    """rank-bm25 with a per-question index built once, as the alternative to bm25s."""
    indexes = {
        info["id"]: BM25Okapi([tokenize(f"{p['title']} {p['text']}") for p in info["paragraphs"]])
        for info in infos
    }

    def call(info: dict[str, Any], query: str) -> str:
        order = np.argsort(-indexes[info["id"]].get_scores(tokenize(query)), kind="stable")
        return " ".join(str(info["paragraphs"][i]["idx"]) for i in order[:TOP_N])

    return call


def our_call(cache: IndexCache, retriever: str) -> ToolCall:
    """What the environment's retrieve_documents does per call."""

    def call(info: dict[str, Any], query: str) -> str:
        index = cache.get(index_key(info), lambda: index_from_info(info))
        return format_documents(index.search(query, retriever, TOP_N))

    return call


def build_costs(infos: list[dict[str, Any]], cache: IndexCache) -> dict[str, dict[str, float]]:
    """One-off per-question costs: index builds (both BM25 libraries) and paragraph embeddings."""
    bm25s_builds, rank_builds, embeds = [], [], []
    for info in infos:
        start = time.perf_counter()
        index = cache.get(index_key(info), lambda info=info: index_from_info(info))
        bm25s_builds.append(time.perf_counter() - start)
        start = time.perf_counter()
        BM25Okapi([tokenize(f"{p['title']} {p['text']}") for p in info["paragraphs"]])
        rank_builds.append(time.perf_counter() - start)
        start = time.perf_counter()
        index.embeddings()
        embeds.append(time.perf_counter() - start)
    return {
        "bm25s_index_build": summary(bm25s_builds, ms=True),
        "rank_bm25_index_build": summary(rank_builds, ms=True),
        "minilm_paragraph_embeddings": summary(embeds[1:], ms=True),  # first includes model load
        "minilm_model_load_and_first_question_ms": embeds[0] * 1e3,
    }


def all_rankings(index: QuestionIndex, query: str) -> dict[str, list[int]]:
    """Document IDs best first under every retriever. Hybrid fuses the two rankings computed
    here (exactly what QuestionIndex.rank does) so each query is embedded once, not twice."""
    bm25 = index.rank(query, "bm25")
    semantic = index.rank(query, "semantic")
    positions = {
        "bm25": bm25,
        "semantic": semantic,
        "hybrid": reciprocal_rank_fusion([bm25, semantic]),
        "golden": index.rank(query, "golden"),
    }
    return {name: [index.docs[pos].idx for pos in ranked] for name, ranked in positions.items()}


def recall_table(rows, infos, cache: IndexCache) -> dict[str, dict[str, float]]:
    """recall@k per retriever: per hop with the sub-questions, per question with the question."""
    hop_hits = {(r, k): [] for r in RETRIEVERS for k in KS}
    question_recall = {(r, k): [] for r in RETRIEVERS for k in KS}
    for row, info in zip(rows, infos, strict=True):
        index = cache.get(index_key(info), lambda info=info: index_from_info(info))
        for query, step in zip(sub_questions(row), row["question_decomposition"], strict=True):
            for retriever, ranked in all_rankings(index, query).items():
                for k in KS:
                    found = step["paragraph_support_idx"] in ranked[:k]
                    hop_hits[retriever, k].append(float(found))
        gold = set(info["supporting_ids"])
        for retriever, ranked in all_rankings(index, row["question"]).items():
            for k in KS:
                question_recall[retriever, k].append(len(gold & set(ranked[:k])) / len(gold))
    return {
        r: {
            **{f"subq_recall@{k}": statistics.fmean(hop_hits[r, k]) for k in KS},
            **{f"question_recall@{k}": statistics.fmean(question_recall[r, k]) for k in KS},
        }
        for r in RETRIEVERS
    }


def latency_table(infos, queries, cache: IndexCache, semantic_calls: int) -> dict[str, Any]:
    """Per-call latency of every retriever and of the seed-style baseline, same queries."""
    table = {
        "seed_rank_bm25_rebuilt_per_call": summary(time_calls(seed_style_call, queries), ms=True),
        "rank_bm25_cached_index": summary(time_calls(rank_bm25_cached(infos), queries), ms=True),
    }
    for retriever in RETRIEVERS:
        subset = queries[:semantic_calls] if retriever in {"semantic", "hybrid"} else queries
        table[retriever] = summary(time_calls(our_call(cache, retriever), subset), ms=True)
    baseline = table["seed_rank_bm25_rebuilt_per_call"]
    for stats in table.values():
        stats["p50_speedup_vs_seed"] = baseline["p50_ms"] / stats["p50_ms"]
        stats["p99_speedup_vs_seed"] = baseline["p99_ms"] / stats["p99_ms"]
    return table


def print_tables(results: dict[str, Any]) -> None:
    print(f"\nPer-call latency, top_n={TOP_N}, {results['rows']} questions (indexes cached)")
    print(f"{'retriever':34} {'calls':>6} {'p50 ms':>9} {'p99 ms':>9} {'p50 x':>8} {'p99 x':>8}")
    for name, s in results["latency"].items():
        print(
            f"{name:34} {s['n']:6d} {s['p50_ms']:9.3f} {s['p99_ms']:9.3f} "
            f"{s['p50_speedup_vs_seed']:8.1f} {s['p99_speedup_vs_seed']:8.1f}"
        )
    print("(x = seed per-call rebuild time / this time)\nOne-off per-question costs:")
    for name, s in results["build_costs"].items():
        value = f"{s:.0f} ms (once)" if isinstance(s, float) else f"{s['p50_ms']:.3f} ms (p50)"
        print(f"  {name}: {value}")
    print(f"\nSupporting-paragraph recall, {results['rows']} questions")
    print(f"{'retriever':10} {'subq@2':>8} {'subq@5':>8} {'question@2':>11} {'question@5':>11}")
    for name, r in results["quality"].items():
        print(
            f"{name:10} {r['subq_recall@2']:8.3f} {r['subq_recall@5']:8.3f} "
            f"{r['question_recall@2']:11.3f} {r['question_recall@5']:11.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument(
        "--semantic-calls", type=int, default=200, help="timed calls for semantic and hybrid"
    )
    parser.add_argument("--out", type=Path, default=result_path("retrieval"))
    args = parser.parse_args()

    started = time.perf_counter()
    rows = load_rows(args.data, args.rows)
    infos = [to_example(row, noise_rate=1.0, seed=0)["info"] for row in rows]
    queries = [(info, q) for row, info in zip(rows, infos, strict=True) for q in sub_questions(row)]
    queries += [(info, row["question"]) for row, info in zip(rows, infos, strict=True)]
    random.Random(0).shuffle(queries)  # interleave questions, same order every run

    cache = IndexCache()
    results: dict[str, Any] = {
        "rows": len(rows),
        "data": str(args.data),
        "torch_threads": torch.get_num_threads(),
        "build_costs": build_costs(infos, cache),
    }
    results["latency"] = latency_table(infos, queries, cache, args.semantic_calls)
    results["quality"] = recall_table(rows, infos, cache)
    results["seconds"] = time.perf_counter() - started
    print_tables(results)
    print(f"\nran in {results['seconds']:.0f} s")
    save("retrieval", results, args.out)


if __name__ == "__main__":
    main()
