"""The reasoning vocabulary in vf-vllm: the logits processor on both of vLLM 0.32's runner
interfaces, the tokenizer mode, the launcher's flags, and a real server on the CPU (sampling
inside think spans only, text decoded as the folded ids, GRPO steps whose pushes keep the
sampler and trainer in agreement)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcRequestState

from rlvr.reasoning_vocab.mapping import load_tokenizer
from rlvr.reasoning_vocab.vllm import ReasoningVocabLogitsProcessor
from rlvr.server.launcher import LaunchError, build_parser, vllm_command
from rlvr.server.plugin import REASONING_VOCAB_TOKENIZER_MODE, register_reasoning_vocab_tokenizer


@pytest.fixture(scope="module")
def vllm_config(rv_model_dir):
    from vllm.config import ModelConfig as VllmModelConfig
    from vllm.config import VllmConfig

    register_reasoning_vocab_tokenizer()
    model = VllmModelConfig(
        model=str(rv_model_dir), tokenizer_mode=REASONING_VOCAB_TOKENIZER_MODE, dtype="float32"
    )
    return VllmConfig(model_config=model)


def expected_logits(gate, logits, inside, temperature):
    """What the gate makes of raw logits, as the sampler divides them afterwards."""
    return gate.gate_logits(logits / temperature, torch.tensor(inside)) * temperature


@pytest.mark.slow
def test_reasoning_vocab_processor_v1_interface_tracks_each_request(vllm_config, gate):
    """The CPU build's runner: requests enter, move and leave the persistent batch; output
    ids grow in the runner's own lists, which the processor reads."""
    tok = load_tokenizer(vllm_config.model_config.tokenizer)
    processor = ReasoningVocabLogitsProcessor(vllm_config, torch.device("cpu"), False)
    assert not processor.is_argmax_invariant()
    open_prompt, plain_prompt = tok.encode("Q: <think> a"), tok.encode("Q: a")
    out_a, out_b = [], []
    processor.update_state(
        BatchUpdate(
            batch_size=2,
            removed=[],
            added=[
                (0, SamplingParams(temperature=0.5), open_prompt, out_a),
                (1, SamplingParams(temperature=1.0), plain_prompt, out_b),
            ],
            moved=[],
        )
    )
    width = gate.vocab.total_vocab_size
    for step, (a, b) in enumerate([(5, 7), *[(t, t) for t in tok.encode(" </think> <think>")]]):
        if step:
            out_a.append(a)
            out_b.append(b)
        raw = torch.randn(2, width)
        got = processor.apply(raw.clone())
        inside = [gate.inside(open_prompt + out_a)[-1], gate.inside(plain_prompt + out_b)[-1]]
        want = torch.stack(
            [
                expected_logits(gate, raw[i : i + 1], inside[i : i + 1], t)[0]
                for i, t in enumerate((0.5, 1.0))
            ]
        )
        assert torch.allclose(got, want, atol=1e-5), step
    assert inside == [True, True]  # both wrote "</think> <think>"
    # swap the rows, b closes its span: each row follows its request (state, temperature)
    processor.update_state(BatchUpdate(2, [], [], [(0, 1, MoveDirectionality.SWAP)]))
    out_b.extend(tok.encode(" </think>"))
    raw = torch.randn(2, width)
    got = processor.apply(raw.clone())
    assert torch.allclose(got[0], expected_logits(gate, raw[:1], [False], 1.0)[0], atol=1e-5)
    assert torch.allclose(got[1], expected_logits(gate, raw[1:], [True], 0.5)[0], atol=1e-5)
    processor.update_state(BatchUpdate(1, [1], [], []))
    assert list(processor.requests) == [0]


def test_reasoning_vocab_processor_v2_interface(vllm_config, gate):
    """The GPU runner's interface, driven with vLLM's own context types. (Its pinned-memory
    buffers cannot be allocated on the CPU build, so the token history is a plain tensor.)"""
    tok = load_tokenizer(vllm_config.model_config.tokenizer)
    history = torch.zeros(4, 64, dtype=torch.int32)
    zeros = SimpleNamespace(gpu=torch.zeros(4, dtype=torch.int32))
    req_states = LogitsProcRequestState(
        device=torch.device("cpu"),
        max_num_reqs=4,
        vocab_size=gate.vocab.total_vocab_size,
        all_token_ids=SimpleNamespace(gpu=history),
        prompt_len=zeros,
        prefill_len=zeros,
        total_len=zeros,
    )
    processor = ReasoningVocabLogitsProcessor(vllm_config, req_states)
    sequences = {3: tok.encode("x <think> y z"), 1: tok.encode("x <think> y </think> z")}
    temperatures = {3: 0.7, 1: 1.0}
    for slot, ids in sequences.items():
        assert processor.add_request(slot, SamplingParams(temperature=temperatures[slot]))
        history[slot, : len(ids)] = torch.tensor(ids)
    for upto in (3, 5):  # two steps, each slot's last token fed at position upto - 1
        slots = np.array([3, 1])
        ctx = LogitsContext(
            expanded_idx_mapping=torch.tensor(slots),
            idx_mapping=torch.tensor(slots),
            idx_mapping_np=slots,
            expanded_local_pos=torch.zeros(2, dtype=torch.long),
            input_ids=torch.tensor([sequences[s][upto - 1] for s in slots]),
            pos=torch.tensor([upto - 1, upto - 1]),
            seq_lens_upper_bound_np=np.array([upto] * 2),
        )
        raw = torch.randn(2, gate.vocab.total_vocab_size)
        got = processor.apply(raw.clone(), ctx)
        for row, slot in enumerate(slots):
            inside = gate.inside(sequences[slot][:upto])[-1:]
            want = expected_logits(gate, raw[row : row + 1], inside, temperatures[slot])
            assert torch.allclose(got[row], want[0], atol=1e-5), (upto, slot)


def test_reasoning_vocab_tokenizer_mode_decodes_copies(rv_model_dir, gate):
    """vLLM's `hf` mode would load the tiny (Qwen2-type) model's tokenizer through
    AutoTokenizer, which rebuilds it with Qwen2's decoder; ours loads it as saved."""
    from vllm.tokenizers.registry import get_tokenizer

    register_reasoning_vocab_tokenizer()
    tokenizer = get_tokenizer(str(rv_model_dir), tokenizer_mode=REASONING_VOCAB_TOKENIZER_MODE)
    vocab = gate.vocab
    ids = [vocab.base_vocab_size + j for j in range(0, vocab.size, 7)]
    assert tokenizer.decode(ids) == tokenizer.decode(vocab.fold(ids)) != ""
    assert tokenizer.max_token_id == vocab.total_vocab_size - 1


def test_reasoning_vocab_launcher_turns_on_gate_and_tokenizer(rv_model_dir, tiny_model_dir):
    def command(model, *extra):
        args, passthrough = build_parser().parse_known_args(["--model", str(model), *extra])
        return vllm_command(args, passthrough, cuda=False)

    cmd = command(rv_model_dir)
    assert cmd[cmd.index("--logits-processors") + 1].endswith(":ReasoningVocabLogitsProcessor")
    assert cmd[cmd.index("--tokenizer-mode") + 1] == REASONING_VOCAB_TOKENIZER_MODE
    assert "--logits-processors" not in command(tiny_model_dir)
    with pytest.raises(LaunchError, match="reasoning vocabulary"):
        command(rv_model_dir, "--tokenizer-mode", "hf")


# ---- a real server ----------------------------------------------------------------------
