"""Nothing the trainer sends crashes a server: scoring prompt log-probabilities (the push probe
at start, resume and return) on a LoRA vf-vllm while adapter generations run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_scoring_during_lora_generation_keeps_the_server_alive(smollm2_server, smollm2_adapter):
    """16 adapter generations and 4 prompt-log-probability requests at once: every one
    answers, the scores are the same as when scored alone, and the server is healthy after
    (vLLM 0.32's CPU LoRA logits path killed the engine here: rlvr.server.lora_logits)."""
    server = smollm2_server
    url = f"{server.base_url}/completions"
    prompt = list(range(1000, 1037))

    def generate(i: int) -> dict:
        body = {
            "model": smollm2_adapter,
            "prompt": list(range(2000 + i, 2020 + i)),
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": i,
            "min_tokens": 24,
        }
        return httpx.post(url, json=body, timeout=300).raise_for_status().json()

    def score(_: int) -> list[float]:
        body = {"model": smollm2_adapter, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0}
        answer = httpx.post(url, json=body, timeout=300).raise_for_status().json()
        entries = answer["choices"][0]["prompt_logprobs"][1:]
        return [e[str(t)]["logprob"] for e, t in zip(entries, prompt[1:], strict=True)]

    alone = score(0)
    with ThreadPoolExecutor(max_workers=20) as pool:
        generations = [pool.submit(generate, i) for i in range(16)]
        scores = [pool.submit(score, i) for i in range(4)]
        answers = [g.result() for g in generations]
        scored = [s.result() for s in scores]
    assert all(a["choices"][0]["text"] for a in answers)
    for s in scored:
        assert s == pytest.approx(alone, abs=1e-4)
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/health", timeout=30).status_code == 200
