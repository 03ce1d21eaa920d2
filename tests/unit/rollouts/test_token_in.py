"""Token-in turns without a server: the id extension against the tiny model's real chat
templates, and whole rollouts through verifiers' loop with a scripted client that renders
and tokenizes as vLLM does (first turn from messages, later turns from the ids sent)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import BadRequestError
from toy_env import think_stripping_template, tool_answers_env
from transformers import AutoTokenizer

from rlvr.config import RolloutsConfig, load_config
from rlvr.rollouts.client import MARKER, TokenInError, extend_prompt_ids
from rlvr.rollouts.groups import run_group
from rlvr.rollouts.request_args import build_sampling_args
from unit.rollouts.test_rollouts import FINAL, TOOL_CALL, ScriptedClient, tool_env

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
REPLY = "The value is 42."


@pytest.fixture(scope="module")
def chatml(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def thinking(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = think_stripping_template()
    return tok


def render(tok, messages, generation_prompt=True, tools=None) -> list[int]:
    text = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )
    return tok.encode(text, add_special_tokens=False)


def extend(tok, prompt_ids, completion, stopped, new, tools=None):
    lone = [{"role": "assistant", "content": MARKER}]
    return extend_prompt_ids(
        prompt_ids,
        completion,
        stopped,
        render(tok, lone, False, tools),
        render(tok, lone + new, True, tools),
        tok.encode(MARKER, add_special_tokens=False),
    )


CONVERSATION = [{"role": "user", "content": "What is the value of a?"}]
TOOL_RESULT = [{"role": "tool", "tool_call_id": "call_0", "content": "value of a is 42"}]


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_token_in_ids_are_the_templates_rendering_where_it_does_not_rewrite(chatml, tools):
    """With a template that keeps earlier turns (ChatML), the extended ids are exactly the
    template's rendering of the whole conversation: the bridge is what the template puts after
    a reply and around the new messages, nothing more or less. A reply that stopped sampled its
    `<|im_end|>` itself; a reply cut by max_tokens gets it from the template."""
    prompt_ids = render(chatml, CONVERSATION, tools=tools)
    reply = chatml.encode(REPLY, add_special_tokens=False)
    end = chatml.convert_tokens_to_ids("<|im_end|>")
    whole = CONVERSATION + [{"role": "assistant", "content": REPLY}] + TOOL_RESULT
    expected = render(chatml, whole, tools=tools)
    assert extend(chatml, prompt_ids, [*reply, end], True, TOOL_RESULT, tools) == expected
    assert extend(chatml, prompt_ids, reply, False, TOOL_RESULT, tools) == expected
    # a user message after the tool results renders as the template renders it too
    user = [{"role": "user", "content": "Now answer."}]
    expected = render(chatml, whole + user, tools=tools)
    assert extend(chatml, prompt_ids, [*reply, end], True, TOOL_RESULT + user, tools) == expected


def test_token_in_keeps_the_end_of_turn_after_a_stop_string_ending_in_a_newline(chatml):
    """A reply stopped by a stop string ending in a newline (`stop: ["\\n"]` with
    include_stop_str_in_output) did not sample its `<|im_end|>`: its last token is the
    closing's newline, not its end-of-turn, and it gets the whole closing, as a reply cut by
    max_tokens does."""
    prompt_ids = render(chatml, CONVERSATION)
    newline = chatml.encode("\n", add_special_tokens=False)
    reply = [*chatml.encode(REPLY, add_special_tokens=False), *newline]
    end = chatml.convert_tokens_to_ids("<|im_end|>")
    ids = extend(chatml, prompt_ids, reply, True, TOOL_RESULT)
    assert ids[: len(prompt_ids) + len(reply)] == prompt_ids + reply
    assert ids[len(prompt_ids) + len(reply) :][:2] == [end, *newline]
    assert ids == extend(chatml, prompt_ids, reply, False, TOOL_RESULT)


def test_token_in_keeps_the_sampled_thinking_that_the_template_strips(thinking):
    """Under a Qwen3-style template the re-rendered conversation drops the reply's empty think
    block (the prompts of two turns do not extend each other: a rollout splits); the token-in
    prompt keeps every sampled and prompt id of the first turn and appends the new messages."""
    prompt_ids = render(thinking, CONVERSATION)
    assert thinking.decode(prompt_ids).endswith("<think>\n\n</think>\n\n")
    end = thinking.convert_tokens_to_ids("<|im_end|>")
    reply = [*thinking.encode(REPLY, add_special_tokens=False), end]
    ids = extend(thinking, prompt_ids, reply, True, TOOL_RESULT)
    assert ids[: len(prompt_ids) + len(reply)] == prompt_ids + reply
    tail = thinking.decode(ids[len(prompt_ids) + len(reply) :])
    assert tail == (
        "\n<|im_start|>user\n<tool_response>\nvalue of a is 42\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    rerendered = render(
        thinking, CONVERSATION + [{"role": "assistant", "content": REPLY}] + TOOL_RESULT
    )
    assert rerendered[: len(prompt_ids)] != prompt_ids


def test_token_in_falls_back_where_renderings_do_not_extend():
    """No extension when the template renders the reference reply differently once messages
    follow it, or when the marker is not where the reference puts the reply."""
    assert extend_prompt_ids([1], [2, 9], True, [5, 7, 9, 3], [5, 7, 9, 3, 4], [7]) == [
        1,
        2,
        9,
        3,
        4,
    ]
    assert extend_prompt_ids([1], [2, 9], True, [5, 7, 9, 3], [5, 8, 9, 3, 4], [7]) is None
    assert extend_prompt_ids([1], [2, 9], True, [5, 7, 9, 3], [5, 7, 9, 3, 4], [6]) is None
    assert extend_prompt_ids([1], [2], False, [5, 7, 9, 3], [5, 7, 9, 3, 4], [7]) == [1, 2, 9, 3, 4]


class TokenInScripted(ScriptedClient):
    """`ScriptedClient` (renders with its tokenizer's chat template, replies from a script)
    that, like vLLM 0.32, generates a turn sent with `kv_transfer_params.prompt_token_ids`
    from those ids, unless `ignores_ids` (a server that does not reuse them); its `/tokenize`
    is the tokenizer's."""

    def __init__(self, tok, replies, rollouts: RolloutsConfig, ignores_ids: bool = False):
        super().__init__(tok, replies)
        self.rollouts = rollouts
        self.ignores_ids = ignores_ids

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        response = await super().get_native_response(prompt, model, sampling_args, tools)
        sent = (sampling_args.get("extra_body") or {}).get("kv_transfer_params") or {}
        if "prompt_token_ids" in sent and not self.ignores_ids:
            response.prompt_token_ids = sent["prompt_token_ids"]
            self.returned[-1] = (sent["prompt_token_ids"], *self.returned[-1][1:])
        return response

    async def _tokenize(self, body):
        if "prompt" in body:
            return self.tok.encode(body["prompt"], add_special_tokens=False)
        return render(self.tok, body["messages"], body["add_generation_prompt"], body.get("tools"))


def run(client, env, group=2):
    env.set_max_seq_len(4096)
    args = [build_sampling_args(load_config().sampling, env.sampling_args, s) for s in range(group)]
    return asyncio.run(run_group(env, client, "m", env.get_dataset()[0], args, 4096, False))


def test_token_in_rollout_trains_the_ids_the_server_generated_from(thinking):
    """A ToolEnv rollout (a tool call, its result, an answer) through verifiers' loop: without
    token_in the stripping template makes each turn a sample of its own; with it, one sample
    per rollout, starting with every prompt the server generated from, loss on the sampled
    tokens only."""
    off = TokenInScripted(thinking, [TOOL_CALL, FINAL], RolloutsConfig())
    result = run(off, tool_env())
    assert result.errored == 0 and [len(r.samples) for r in result.rollouts] == [2, 2]
    on = TokenInScripted(thinking, [TOOL_CALL, FINAL], RolloutsConfig(token_in=True))
    result = run(on, tool_env())
    assert result.errored == 0 and [len(r.samples) for r in result.rollouts] == [1, 1]
    for rollout in result.rollouts:
        assert rollout.reward == 1.0
        (sample,) = rollout.samples
        turns = {len(p): (p, c) for p, c, _ in on.returned if sample.input_ids[: len(p)] == p}
        (first, reply), (second, answer) = (turns[k] for k in sorted(turns))
        assert sample.input_ids == second + answer and second[: len(first + reply)] == first + reply
        assert sum(sample.loss_mask) == len(reply) + len(answer) == rollout.completion_tokens
        masked = [t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if not m]
        assert thinking.decode(masked[len(first) :]).startswith("\n<|im_start|>user\n<tool_resp")
        assert TOOL_RESULT[0]["content"] in thinking.decode(masked)


@pytest.mark.parametrize(("keep", "samples"), [("all", 1), ("tool_calls", 2)])
def test_token_in_thinking_policy_decides_the_turn_after_a_user_message(thinking, keep, samples):
    """Tool results, then a user message: `all` extends every turn (one sample), `tool_calls`
    renders the turn after the user message from the messages (the template strips the think
    blocks, a second sample)."""
    client = TokenInScripted(thinking, [REPLY], RolloutsConfig(token_in=True, keep_thinking=keep))
    result = run(client, tool_answers_env(target=0, turns=3))
    assert result.errored == 0 and [r.num_turns for r in result.rollouts] == [3, 3]
    assert [len(r.samples) for r in result.rollouts] == [samples, samples]


def test_token_in_refuses_a_server_that_ignores_the_ids(thinking):
    """A server that renders the messages instead of generating from the ids sent would make
    the trainer train a context the sampler never saw: the run stops with the reason."""
    client = TokenInScripted(thinking, [TOOL_CALL, FINAL], RolloutsConfig(token_in=True), True)
    with pytest.raises(TokenInError, match="ignores kv_transfer_params.prompt_token_ids"):
        run(client, tool_env())


def test_token_in_renders_from_messages_where_the_server_cannot_tokenize_the_tail(thinking):
    """A template that refuses the lone reply's conversation (`/tokenize` answers 400): the turn
    is rendered from its messages, as without token_in; the rollout does not error."""

    class Refusing(TokenInScripted):
        async def _tokenize(self, body):
            if "messages" in body:
                request = httpx.Request("POST", "http://127.0.0.1/tokenize")
                raise BadRequestError(
                    "tool message without a call",
                    response=httpx.Response(400, request=request),
                    body=None,
                )
            return await super()._tokenize(body)

    result = run(Refusing(thinking, [TOOL_CALL, FINAL], RolloutsConfig(token_in=True)), tool_env())
    assert result.errored == 0 and [len(r.samples) for r in result.rollouts] == [2, 2]
