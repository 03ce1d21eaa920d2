"""Which dataset rows become training prompts: the order they are used in (`PromptOrder`, a
resumable permutation per epoch) and the filter that passes over prompts too long to train on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.messages import message_field


def prompt_length_filter(
    tokenizer: Any, max_len: int, tool_defs: list | None = None
) -> Callable[[dict], bool]:
    """A predicate: does this dataset row's prompt, rendered with the chat template (and the
    environment's tools), fit in `max_len` tokens?"""
    tools = [
        {
            "type": "function",
            "function": {
                "name": message_field(t, "name"),
                "description": message_field(t, "description"),
                "parameters": message_field(t, "parameters"),
            },
        }
        for t in tool_defs or []
    ] or None

    def fits(row: dict) -> bool:
        prompt = row["prompt"]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        messages = [
            {"role": message_field(m, "role"), "content": message_field(m, "content")}
            for m in prompt
        ]
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return len(tokenizer.encode(text, add_special_tokens=False)) <= max_len

    return fits


class PromptOrder:
    """The order in which dataset rows are used: epoch e walks a permutation seeded by
    (seed, e). A position in this stream (saved in checkpoints) is all a resumed run needs to
    continue with exactly the rows the interrupted run would have used next."""

    def __init__(self, num_rows: int, seed: int):
        if num_rows < 1:
            raise ValueError("the environment's training dataset is empty")
        self.num_rows = num_rows
        self.seed = seed
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            import random

            perm = list(range(self.num_rows))
            random.Random(self.seed * 100_003 + epoch).shuffle(perm)
            self._perms = {epoch: perm}
        return self._perms[epoch]

    def rows(self, start: int, count: int) -> list[int]:
        return [
            self._perm(p // self.num_rows)[p % self.num_rows] for p in range(start, start + count)
        ]
