"""Runs under the verifiers 0.4 side venv, not ours: several turns of one episode through
renderers' own `generate` (what 0.4's `train` client calls) against a base URL, printing one
JSON line per turn. Usage: python side04_generate.py BASE_URL MODEL TOKENIZER_DIR SEED TURNS"""

from __future__ import annotations

import asyncio
import json
import sys

from openai import AsyncOpenAI
from renderers import create_renderer
from renderers.base import load_tokenizer
from renderers.client import generate


async def episode(base_url: str, model: str, tokenizer_dir: str, seed: int, turns: int) -> None:
    """Each turn appends the model's reply and a new user message, as a multi-turn env does."""
    renderer = create_renderer(load_tokenizer(tokenizer_dir))
    client = AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    messages = [{"role": "user", "content": "Say a number."}]
    for turn in range(turns):
        result = await generate(
            client=client,
            renderer=renderer,
            messages=messages,
            model=model,
            sampling_params={"max_tokens": 6, "seed": seed, "temperature": 1.0},
        )
        keys = ("prompt_ids", "completion_ids", "completion_logprobs", "finish_reason")
        print(json.dumps({k: result[k] for k in keys}), flush=True)
        messages += [
            {"role": "assistant", "content": result["content"] or ""},
            {"role": "user", "content": f"And another, turn {turn + 1}."},
        ]
    await client.close()


if __name__ == "__main__":
    url, model, tok, seed, turns = sys.argv[1:]
    asyncio.run(episode(url, model, tok, int(seed), int(turns)))
