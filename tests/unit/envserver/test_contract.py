"""Contract with verifiers 0.4's own client: on a recorded real run of each fixture taskset
(tests/fixtures/envserver/recorded, recorded with 0.4's `EnvClient` against vf-vllm), our
assembly of the streamed frames is the episode `EnvClient` assembled, and both give the same
rollout state (turns, reward, truncation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.envserver.episode import episode_state
from rlvr.envserver.wire import Assembly, unpack

RECORDED = sorted((Path(__file__).parents[2] / "fixtures" / "envserver" / "recorded").glob("*"))


def assembled(record: dict) -> dict:
    """Our episode from the recorded frames, as `EnvServerClient.run` builds it."""
    assembly = Assembly()
    reply = None
    for kind, data in record["frames"]:
        if kind == b"delta":
            assembly.apply(unpack(data))
        else:
            reply = unpack(data)
    assert reply is not None and reply["success"], reply
    return assembly.finish(reply["head"], reply["traces"])


def common(ours: dict, theirs: dict, where: str) -> None:
    """Every field of ours that 0.4's episode also carries holds the same value."""
    shared = set(ours) & set(theirs)
    assert len(shared) >= len(ours) - 1, f"{where}: only {sorted(shared)} in common"
    for key in sorted(shared):
        assert ours[key] == theirs[key], f"{where}.{key}"


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_our_client_assembles_the_episode_envclient_assembled(path) -> None:
    record = unpack(path.read_bytes())
    ours, theirs = assembled(record), record["episode"]
    assert len(ours["traces"]) == len(theirs["traces"]) >= 1
    for i, (mine, its) in enumerate(zip(ours["traces"], theirs["traces"], strict=True)):
        assert len(mine["nodes"]) == len(its["nodes"]) >= 2
        for n, (a, b) in enumerate(zip(mine["nodes"], its["nodes"], strict=True)):
            common(a, b, f"traces[{i}].nodes[{n}]")
        for n, (a, b) in enumerate(zip(mine["calls"], its["calls"], strict=True)):
            common(a, b, f"traces[{i}].calls[{n}]")
        for key in ("rewards", "metrics", "stop_condition", "ok", "errors", "agent", "task"):
            assert mine[key] == its[key], f"traces[{i}].{key}"
    row = {"example_id": 0}
    assert episode_state(ours, row) == episode_state(theirs, row)
    state = episode_state(ours, row)
    assert state["error"] is None and state["trajectory"]
    assert all(sum(t["tokens"]["completion_mask"]) > 0 for t in state["trajectory"])
