"""Token-in turns (`rollouts.token_in`) against the real vf-vllm on the tiny model, with a
request chat template that strips earlier turns' think blocks (Qwen3-style, thinking off)."""

from __future__ import annotations

import asyncio

import pytest
from support import chat_requests, recording_proxy, target_id
from toy_env import think_stripping_template, tool_answers_env
from transformers import AutoTokenizer

from rlvr.config import RolloutsConfig
from rlvr.rollouts.client import make_client
from rlvr.rollouts.groups import run_group

TURNS = 3
ROLLOUTS = 4


async def _group(url: str, model: str, env, row, args, token_in: bool):
    client = make_client(
        url, None, 300, 8, training=False, rollouts=RolloutsConfig(token_in=token_in)
    )
    try:
        return await run_group(env, client, model, row, args, 4096, False)
    finally:
        await client.close()


@pytest.mark.integration
def test_token_in_multi_turn_is_one_sample(tiny_server):
    """Without token_in, each turn's prompt is the template's re-rendering, which drops the
    earlier turns' think blocks: a rollout becomes one sample per turn. With it, one sample per
    rollout, whose ids are what the server generated from, turn by turn: the first turn's
    prompt is the server's rendering of the messages, every later turn's the ids sent (the
    client checks that the server reports generating from them), and only sampled tokens
    carry loss."""
    template = think_stripping_template()
    tok = AutoTokenizer.from_pretrained(tiny_server.model_dir)
    tok.chat_template = template
    env = tool_answers_env(target_id(tiny_server.model_dir), turns=TURNS)
    row = env.get_dataset()[0]
    extra = {**tiny_server.sampling_args["extra_body"], "chat_template": template}
    args = [
        {
            "temperature": 1.0,
            "max_tokens": 16,
            "seed": 100 + r,
            "logprobs": True,
            "extra_body": {**extra, "return_token_ids": True},
        }
        for r in range(ROLLOUTS)
    ]
    groups, bodies = {}, {}
    for token_in in (False, True):
        with recording_proxy(tiny_server) as (url, requests):
            groups[token_in] = asyncio.run(_group(url, tiny_server.model, env, row, args, token_in))
            bodies[token_in] = chat_requests(requests)
    for group in groups.values():
        assert group.errored == 0 and [r.num_turns for r in group.rollouts] == [TURNS] * ROLLOUTS
    assert [len(r.samples) for r in groups[False].rollouts] == [TURNS] * ROLLOUTS
    assert not any("kv_transfer_params" in b for b in bodies[False])
    assert [len(r.samples) for r in groups[True].rollouts] == [1] * ROLLOUTS

    first = tok.encode(
        tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    sent = [
        b["kv_transfer_params"]["prompt_token_ids"]
        for b in bodies[True]
        if "kv_transfer_params" in b
    ]
    assert len(bodies[True]) == TURNS * ROLLOUTS and len(sent) == (TURNS - 1) * ROLLOUTS
    for rollout in groups[True].rollouts:
        (sample,) = rollout.samples
        ids, mask = sample.input_ids, sample.loss_mask
        assert ids[: len(first)] == first and not any(mask[: len(first)])
        turns = sorted((p for p in sent if ids[: len(p)] == p), key=len)
        assert len(turns) == TURNS - 1, "each later turn's prompt ids start the sample"
        assert all(mask[len(turns[-1]) :]), "the sample ends with the last turn's reply"
        assert sum(mask) == rollout.completion_tokens
        unmasked = tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
        assert "<tool_response>\nresult 1\n</tool_response>" in unmasked
        assert "Now answer." in unmasked
        assert unmasked.count("<think>\n\n</think>") == TURNS, "every turn keeps its block"


@pytest.mark.integration
@pytest.mark.slow
def test_token_in_trains_the_ids_the_server_saw(tiny_server, tmp_path):
    """`rollouts.token_in=true` through the trainer (`start_worker` makes the client):
    one sample per multi-turn rollout, and the trainer's log-probabilities of its sampled
    tokens match the server's (mismatch-KL near 0: it trains the context the sampler saw)."""
    from support import config

    from rlvr.trainer.grpo import Trainer

    env = tool_answers_env(target_id(tiny_server.model_dir), turns=TURNS)
    # beta > 0: the step runs its forward whatever the rewards (one group of the tiny model
    # often scores all alike, and a step without signal trains and measures nothing)
    extra = ("max_steps=1", "batch.batch_size=8", "rollouts.token_in=true", "loss.beta=0.01")
    cfg = config(tiny_server, tmp_path, *extra)
    cfg.sampling.extra_body["chat_template"] = think_stripping_template()
    (step,) = Trainer(cfg, env=env).run()
    assert step["rollouts/turns"] == TURNS
    assert step["rollouts/samples"] == step["rollouts/count"] - step["rollouts/errored"]
    assert step["mismatch_kl"] < 1e-3
