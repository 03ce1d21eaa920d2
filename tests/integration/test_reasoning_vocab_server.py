"""The reasoning vocabulary in vf-vllm: the logits processor on both of vLLM 0.32's runner
interfaces, the tokenizer mode, the launcher's flags, and a real server on the CPU (sampling
inside think spans only, text decoded as the folded ids, GRPO steps whose pushes keep the
sampler and trainer in agreement)."""

from __future__ import annotations

import httpx
import pytest
import verifiers as vf
from datasets import Dataset
from support import assert_push_checked
from tokenizers.decoders import DecodeStream

from rlvr.config import load_config
from rlvr.reasoning_vocab.mapping import ReasoningVocab, load_tokenizer
from rlvr.trainer.grpo import Trainer

# ---- a real server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rv_server(rv_model_dir, tmp_path_factory):
    """The one extra server of these tests: the expanded tiny model, able to load adapters (so
    that choosing merged pushes for a LoRA policy is the trainer's doing, not the server's)."""
    from conftest import _serve

    from rlvr.server.launcher import lora_flags

    server = _serve(str(rv_model_dir), tmp_path_factory.mktemp("rv-server"), extra=lora_flags(16))
    server.model_dir = rv_model_dir
    yield server
    server.stop()


@pytest.mark.integration
def test_reasoning_vocab_served_model_thinks_in_reasoning_ids_only_inside_spans(
    rv_server, gate, tiny_model_dir
):
    """Prompts that open a span, close one, or have none; a logit bias on the delimiter
    tokens makes the random model open and close spans itself. Every sampled reasoning id
    lies inside a span, spans hold reasoning ids, and the returned text is what the plain
    model's tokenizer makes of the ids with reasoning ids folded onto their originals,
    decoded incrementally as vLLM does (an incomplete UTF-8 tail is held back)."""
    plain = load_tokenizer(tiny_model_dir).backend_tokenizer
    tok = load_tokenizer(rv_server.model_dir)  # the expanded one, to find the delimiters
    vocab = gate.vocab
    pieces = set(tok.encode(" <think> </think>"))  # bias them and their copies: spans open
    copies = {vocab.base_vocab_size + j for j, t in enumerate(vocab.original_ids) if t in pieces}
    bias = {str(t): 5.0 for t in pieces | copies}
    counts = {"inside": 0, "outside": 0, "reasoning": 0, "transitions": 0}
    for prompt in ("Answer: <think>", "Answer plainly:", "x <think> y </think>"):
        body = {
            "model": rv_server.model,
            "prompt": prompt,
            "max_tokens": 96,
            "n": 4,
            "temperature": 1.0,
            "logprobs": 1,
            "return_token_ids": True,
            "logit_bias": bias,
            "seed": 0,
        }
        response = httpx.post(f"{rv_server.base_url}/completions", json=body, timeout=600)
        response.raise_for_status()
        for choice in response.json()["choices"]:
            ids, prompt_ids = choice["token_ids"], choice["prompt_token_ids"]
            inside = gate.inside(prompt_ids + ids)[len(prompt_ids) - 1 : -1]
            for token, here in zip(ids, inside, strict=True):
                counts["inside" if here else "outside"] += 1
                if token >= vocab.base_vocab_size:
                    assert here, (prompt, ids)
                    counts["reasoning"] += 1
            counts["transitions"] += sum(a != b for a, b in zip(inside, inside[1:], strict=False))
            assert choice["text"] == stream_decode(plain, vocab.fold(ids))
    print(counts)
    assert counts["inside"] > 50 and counts["outside"] > 50 and counts["transitions"] >= 1
    assert counts["reasoning"] > counts["inside"] / 10


def stream_decode(tokenizer, ids: list[int]) -> str:
    """Text as vLLM's incremental detokenizer makes it (special tokens skipped)."""
    stream = DecodeStream(skip_special_tokens=True)
    return "".join(stream.step(tokenizer, t) or "" for t in ids)


def think_env(vocab: ReasoningVocab) -> vf.SingleTurnEnv:
    """Half the prompts open a think span; reward = share of reasoning ids in the reply."""

    def reasoning_share(state) -> float:
        ids = [t for step in state["trajectory"] for t in step["tokens"]["completion_ids"]]
        return sum(t >= vocab.base_vocab_size for t in ids) / max(len(ids), 1)

    rows = [
        {"question": f"Item {i}: <think>" if i % 2 else f"Item {i}.", "answer": ""}
        for i in range(8)
    ]
    dataset = Dataset.from_list(rows)
    rubric = vf.Rubric(funcs=[reasoning_share], weights=[1.0])
    return vf.SingleTurnEnv(dataset=dataset, eval_dataset=dataset, rubric=rubric)


@pytest.mark.integration
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_reasoning_vocab_grpo_steps_with_pushes_keep_mismatch_kl_low(rv_server, tmp_path, lora):
    """Two GRPO steps with a large learning rate: the reasoning rows move (cosine to their
    originals drops), and after each push the sampler's log-probabilities, gated by the
    server's processor, still match the trainer's, gated by the loss's hook. LoRA pushes
    merged weights (vLLM's LoRA cannot serve the trained rows) under the served name."""
    vocab = ReasoningVocab.load(rv_server.model_dir)
    cfg = load_config(
        overrides=[
            f"model.name={rv_server.model_dir}",
            f"server.base_url={rv_server.base_url}",
            f"server.served_model={rv_server.model}",
            "batch.batch_size=16",
            "batch.rollouts_per_example=4",
            "batch.micro_batch_size=8",
            "batch.async_level=0",
            "sampling.max_tokens=24",
            "sampling.temperature=0.8",
            "optim.lr=2e-2",
            f"lora.enabled={str(lora).lower()}",
            "max_steps=2",
            "seed=0",
            "wandb.mode=disabled",
            "logging.progress_bar=false",
            "checkpoint.every=0",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    trainer = Trainer(cfg, env=think_env(vocab))
    history = trainer.run()
    assert trainer.weights.served_name(0) == cfg.served_model  # merged pushes, also for LoRA
    for h in history:
        print({k: round(v, 6) for k, v in h.items() if k.startswith(("reasoning/", "mismatch"))})
    assert max(h["mismatch_kl"] for h in history) < 1e-3
    for h in history:  # every row, the added ones too, holds what was pushed
        assert_push_checked(h)
    assert all(0.3 < h["reasoning/think_tokens"] < 0.7 for h in history)
    assert all(h["reasoning/reasoning_id_share"] > 0.2 for h in history)
    assert history[0]["reasoning/embedding_cosine"] < 0.999  # rows moved after step 1
    final = tmp_path / "run" / "final"
    assert ReasoningVocab.load(final) == vocab
