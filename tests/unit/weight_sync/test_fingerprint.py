"""Fingerprints: exact across fusing, sharding, padding and summation order; one changed element
or a swapped dtype is seen; replicas and shards are added up as the server holds them."""

from __future__ import annotations

import torch

from rlvr.weight_sync.fingerprint import (
    Expected,
    Fingerprint,
    ServedWeights,
    Verified,
    adapter_expected,
    aliases,
    fingerprint,
    mismatches,
    to_wire,
    verified_metrics,
)

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}


def test_bit_sums_add_across_fused_and_padded_tensors():
    torch.manual_seed(0)
    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    fused = torch.cat([q, k, v, torch.zeros(3, 4)])  # with padded rows
    parts = fingerprint(q) + fingerprint(k) + fingerprint(v)
    assert fingerprint(fused).bits == parts.bits
    assert fingerprint(fused.flip(0)).bits == parts.bits  # any order


def test_one_changed_element_is_seen_at_every_dtype():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(64, 64).to(dtype)
        y = x.clone()
        y[5, 7] = torch.nextafter(y[5, 7].float(), torch.tensor(10.0)).to(dtype)
        if y[5, 7] == x[5, 7]:  # the float32 step rounded away: take the dtype's own step
            y[5, 7] = (x[5, 7].float() * 1.01 + 1e-3).to(dtype)
        assert fingerprint(x).bits != fingerprint(y).bits, dtype


def test_expected_maps_names_casts_and_expects_tied_aliases():
    served = ServedWeights(
        dtypes={
            "layers.0.qkv_proj.weight": torch.bfloat16,
            "embed.weight": torch.float32,
            "lm_head.weight": torch.float32,
        },
        prints={},
        packed=PACKED,
    )
    expected = Expected(served, {"lm_head.weight": "embed.weight"})
    torch.manual_seed(0)
    sent = {f"layers.0.{p}.weight": torch.randn(4, 4) for p in ("q_proj", "k_proj", "v_proj")}
    sent["embed.weight"] = torch.randn(10, 4)
    assert expected.unknown([*sent, "layers.0.o_proj.weight"]) == ["layers.0.o_proj.weight"]
    streamed = list(expected.tap(iter(sent.items())))
    assert [n for n, _ in streamed] == list(sent)  # unchanged stream
    qkv = torch.cat([sent[f"layers.0.{p}.weight"] for p in ("q_proj", "k_proj", "v_proj")])
    assert expected.prints["layers.0.qkv_proj.weight"].bits == fingerprint(qkv.bfloat16()).bits
    assert expected.prints["lm_head.weight"] == expected.prints["embed.weight"]
    held = ServedWeights(served.dtypes, dict(expected.prints), PACKED)
    assert mismatches(expected.prints, held) == []
    stale = dict(expected.prints, **{"lm_head.weight": Fingerprint(1)})
    assert [m.name for m in mismatches(expected.prints, ServedWeights({}, stale))] == [
        "lm_head.weight"
    ]
    gone = {k: v for k, v in expected.prints.items() if k != "embed.weight"}
    assert [m.served for m in mismatches(expected.prints, ServedWeights({}, gone))] == [None]


def test_shards_add_and_replicated_parameters_count_once():
    torch.manual_seed(0)
    w, norm = torch.randn(8, 4), torch.randn(4)
    shards = [w[:4], w[4:]]

    def answer(shard):
        prints = {"w": ("float32", fingerprint(shard)), "norm": ("float32", fingerprint(norm))}
        return {"params": to_wire(prints), "sharded": ["w"], "packed": {}}

    held = ServedWeights.from_answers([answer(s) for s in shards])
    assert held.prints["w"].bits == fingerprint(w).bits
    assert held.prints["norm"].bits == fingerprint(norm).bits
    assert held.dtypes == {"w": torch.float32, "norm": torch.float32}


def test_aliases_name_tied_parameters():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    assert aliases(model) == {}
    model.head.weight = model.embed.weight
    assert aliases(model) == {"head.weight": "embed.weight"}


def test_verified_metrics_per_server_and_totals():
    checks = {0: Verified(1, 0.5, 10, []), 1: Verified(1, 0.25, 10, [object()]), 2: None}
    metrics = verified_metrics(checks)
    assert metrics["push/0/failed_params"] == 0 and metrics["push/1/failed_params"] == 1
    assert metrics["push/verify_seconds"] == 0.75 and metrics["push/verified_params"] == 20
    assert "push/2/verified_params" not in metrics


def test_replicated_key_value_heads_are_not_judged():
    prints = {"qkv": ("float32", Fingerprint(5)), "o": ("float32", Fingerprint(7))}
    answer = {"params": to_wire(prints), "sharded": ["qkv", "o"], "unchecked": ["qkv"]}
    held = ServedWeights.from_answers([answer, answer])
    assert held.unchecked == {"qkv"}
    sent = {"qkv": Fingerprint(5), "o": Fingerprint(14)}
    assert mismatches(sent, held) == []
    assert [m.name for m in mismatches({**sent, "o": Fingerprint(7)}, held)] == ["o"]


def test_adapter_expected_is_what_vllm_stores():
    """A PEFT adapter's matrices, fingerprinted as vLLM's LoRA loader stores them (cast to the
    server's dtype, then B scaled in place by `optimize`): q and v sum into qkv_proj, lora_A
    is not scaled, and another scaling or a B left unscaled is seen."""
    from vllm.lora.lora_weights import LoRALayerWeights

    torch.manual_seed(0)
    prefix = "base_model.model.model.layers.0.self_attn"
    state = {
        f"{prefix}.{proj}.lora_{ab}.default.weight": torch.randn(8, 16) * 0.1
        for proj in ("q_proj", "v_proj")
        for ab in "AB"
    }
    # not 2 and 1/2: on same-shaped parts those exponent shifts cancel in the bit sums
    scalings = {f"{prefix}.q_proj": 2.0, f"{prefix}.v_proj": 0.25}
    for dtype in (torch.float32, torch.bfloat16):
        held = {}
        for proj in ("q_proj", "v_proj"):
            weights = LoRALayerWeights(
                proj,
                8,
                16,
                state[f"{prefix}.{proj}.lora_A.default.weight"].to(dtype, copy=True),
                state[f"{prefix}.{proj}.lora_B.default.weight"].to(dtype, copy=True),
                scaling=scalings[f"{prefix}.{proj}"],
            ).optimize()
            for part in ("lora_a", "lora_b"):
                held.setdefault(part, []).append(fingerprint(getattr(weights, part)))
        name = "model.layers.0.self_attn.qkv_proj"
        served = ServedWeights(
            {f"{name}.lora_a": dtype, f"{name}.lora_b": dtype},
            {f"{name}.{part}": sum(p[1:], p[0]) for part, p in held.items()},
            PACKED,
        )
        assert mismatches(adapter_expected(state, scalings, served), served) == [], dtype
        for wrong in ({**scalings, f"{prefix}.v_proj": 1.0}, {}):
            failed = mismatches(adapter_expected(state, wrong, served), served)
            assert [m.name for m in failed] == [f"{name}.lora_b"], (dtype, wrong)
