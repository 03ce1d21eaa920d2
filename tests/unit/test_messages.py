"""Reading chat messages on the trainer side (`rlvr.messages`): dicts and objects alike."""

from __future__ import annotations

from types import SimpleNamespace

from rlvr.messages import display_text, message_field, render_messages


def test_a_message_reads_the_same_as_a_dict_and_as_an_object():
    as_dict = {"role": "assistant", "content": "hi"}
    as_object = SimpleNamespace(**as_dict)
    for message in (as_dict, as_object):
        assert message_field(message, "role") == "assistant"
        assert message_field(message, "tool_calls", []) == []


def test_the_sample_table_shows_text_parts_and_tool_calls():
    call = SimpleNamespace(name="search", arguments='{"q": "x"}')
    message = {"role": "assistant", "content": [{"text": "a"}, {"text": "b"}], "tool_calls": [call]}
    assert display_text(message) == 'a b\n[tool_call search({"q": "x"})]'
    conversation = [{"role": "user", "content": None}, message]
    assert render_messages(conversation, limit=12) == "user: \nassis"
    assert render_messages("plain completion", limit=5) == "plain"
