"""A served episode -> the rollout state our trainer reads (`rlvr.rollouts.to_samples`).

Each root-to-leaf branch of the trainable trace's message graph becomes its turns: a sampled
node's completion (its tokens under the mask) after everything before it on the path. A sampled
node that an earlier branch already holds keeps its tokens but gets mask 0, so it trains once.
The reward is the sum of the named score x weight entries, truncation follows verifiers 0.4's
rule; an episode that errored carries `error`. Design: docs/training.md#verifiers-04-environments.
"""

from __future__ import annotations

from typing import Any

from rlvr.finite import finite_number

TRUNCATING_STOPS = {
    "max_turns",
    "max_input_tokens",
    "max_output_tokens",
    "max_total_tokens",
    "compaction_failed",
}
"""Stop conditions verifiers 0.4 counts as truncation (`Trace.is_truncated`)."""


def branches(trace: dict) -> list[list[int]]:
    """Every root-to-leaf path of the trace's graph, as node indices, in leaf order."""
    nodes = trace["nodes"]
    has_child = {node["parent"] for node in nodes if node.get("parent") is not None}
    paths = []
    for leaf in (i for i in range(len(nodes)) if i not in has_child):
        path: list[int] = []
        index: int | None = leaf
        while index is not None:
            path.append(index)
            index = nodes[index].get("parent")
        paths.append(path[::-1])
    return paths


def trainable_branch(trace: dict, path: list[int]) -> bool:
    """False for a compaction attempt the harness did not resume from (verifiers' rule)."""
    nodes = trace["nodes"]
    links = nodes[path[-1]].get("semantic_parents") or []
    if not any(link.get("type") == "compaction_attempt" for link in links):
        return True
    accepted = {
        link.get("node")
        for node in nodes
        for link in node.get("semantic_parents") or []
        if link.get("type") == "compaction"
    }
    return path[-1] in accepted


def _spread(mask: list[bool], values: list[float]) -> list[float]:
    """`values` (one per True of `mask`) laid onto the mask's positions, 0.0 elsewhere."""
    it = iter(values)
    return [float(next(it, 0.0)) if m else 0.0 for m in mask]


def branch_turns(trace: dict, path: list[int], trained: set[int]) -> list[dict]:
    """The turns of one branch in the trajectory format of `rlvr.rollouts.to_samples`; the
    sampled nodes it trains are added to `trained`."""
    finish = {call.get("node"): call.get("finish_reason") for call in trace["calls"]}
    turns: list[dict] = []
    prefix: list[int] = []
    for index in path:
        node = trace["nodes"][index]
        ids, mask = list(node["token_ids"]), [bool(m) for m in node["mask"]]
        if node.get("sampled") and any(mask):
            first = mask.index(True)
            sampled = mask[first:]
            logprobs = _spread(sampled, node.get("logprobs") or [])
            if len(node.get("logprobs") or []) != sum(sampled):
                raise ValueError(
                    f"node {index}: {sum(sampled)} sampled tokens but "
                    f"{len(node.get('logprobs') or [])} log-probabilities"
                )
            trains = index not in trained
            trained.add(index)
            turns.append(
                {
                    "tokens": {
                        "prompt_ids": prefix + ids[:first],
                        "completion_ids": ids[first:],
                        "completion_mask": [int(m and trains) for m in sampled],
                        "completion_logprobs": logprobs,
                    },
                    "is_truncated": finish.get(index) == "length",
                }
            )
        prefix = prefix + ids
    return turns


def trajectory(trace: dict) -> list[dict]:
    """Every trainable branch's turns, branch after branch."""
    trained: set[int] = set()
    turns: list[dict] = []
    for path in branches(trace):
        if trainable_branch(trace, path):
            turns += branch_turns(trace, path, trained)
    return turns


def reward(trace: dict) -> float | None:
    """The sum of score x weight over the named rewards that were scored (None: not a number)."""
    total = 0.0
    for entry in (trace.get("rewards") or {}).values():
        if entry is None:
            continue
        score, weight = finite_number(entry.get("score")), finite_number(entry.get("weight", 1.0))
        if score is None or weight is None:
            return None
        total += score * weight
    return total


def is_truncated(trace: dict) -> bool:
    """A framework limit stopped it, or its last call that did not fail ended by length."""
    if trace.get("stop_condition") in TRUNCATING_STOPS:
        return True
    last = next((c for c in reversed(trace["calls"]) if c.get("error") is None), None)
    return bool(last and last.get("finish_reason") == "length")


def trainable_traces(episode: dict) -> list[dict]:
    """The traces whose tokens train the policy (a judge's or a user simulator's do not)."""
    return [t for t in episode.get("traces") or [] if (t.get("agent") or {}).get("trainable", True)]


def episode_error(episode: dict) -> str | None:
    """Why the episode cannot train, or None: it errored, or it has no single trainable trace."""
    errors = list(episode.get("errors") or [])
    traces = trainable_traces(episode)
    for trace in traces:
        errors += trace.get("errors") or []
    if errors:
        last = errors[-1]
        return f"{last.get('type')}: {last.get('message')}"
    if not episode.get("ok", False):
        return "the episode did not complete"
    if len(traces) != 1:
        return f"{len(traces)} trainable traces in one episode (one is supported)"
    return None


def _messages(trace: dict) -> tuple[list[dict], list[dict]]:
    """The first branch's messages: those before its first sampled node, and the rest."""
    paths = branches(trace)
    if not paths:
        return [], []
    nodes = [trace["nodes"][i] for i in paths[0]]
    first = next((i for i, node in enumerate(nodes) if node.get("sampled")), len(nodes))
    messages = [node["message"] for node in nodes]
    return messages[:first], messages[first:]


def episode_state(episode: dict, row: dict) -> dict[str, Any]:
    """The rollout state of one served episode of dataset row `row` (see the module doc)."""
    state: dict[str, Any] = {"example_id": row.get("example_id", 0), "answer": row.get("answer")}
    error = episode_error(episode)
    if error is not None:
        return {**state, "error": error, "trajectory": []}
    (trace,) = trainable_traces(episode)
    prompt, completion = _messages(trace)
    rewards = trace.get("rewards") or {}
    metrics = {name: entry.get("score") for name, entry in rewards.items() if entry}
    metrics.update({k: v for k, v in (trace.get("metrics") or {}).items() if v is not None})
    return {
        **state,
        "error": None,
        "prompt": prompt,
        "completion": completion,
        "trajectory": trajectory(trace),
        "reward": reward(trace),
        "metrics": metrics,
        "is_truncated": is_truncated(trace),
    }
