"""One weight-push interface: the trainer holds a `WeightPush` and never asks which."""

from __future__ import annotations


def test_merged_and_adapter_pushes_are_weight_pushes():
    """Both pushes implement the interface; a merged push serves every version under the one
    model name it was given, and leaving its block closes its connection (nothing here talks
    to a server: construction does not)."""
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.base import WeightPush
    from rlvr.weight_sync.merged import MergedPush

    assert issubclass(MergedPush, WeightPush) and issubclass(AdapterPush, WeightPush)
    with MergedPush("http://127.0.0.1:9/v1", "served-policy") as weights:
        assert isinstance(weights, WeightPush)
        assert [weights.served_name(v) for v in (0, 1, 7)] == ["served-policy"] * 3
        weights.release([0, 1])  # nothing to free: a merged push replaces the served weights
    assert weights.control.http.is_closed
