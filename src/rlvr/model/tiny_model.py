"""A tiny random-weight chat model built from scratch, for fast tests and benchmarks.

It has the shape vLLM's CPU attention needs (head_dim 64), a byte-level BPE tokenizer trained
here with `tokenizers` (no downloads), and the same hermes tool-calling template as the embedded
model, so every serving and training path can be exercised in seconds.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.atomic import atomic_directory

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Words that make the chat template, tool-call JSON and typical env prompts cheap to tokenize.
_CORPUS_LINES = [
    "system user assistant tool <tool_call> </tool_call> <tool_response> </tool_response>",
    '{"name": "retrieve_documents", "arguments": {"query": "who", "top_n": 3}}',
    "You are a helpful assistant. Answer with \\boxed{42}. <think> </think> <move> </move>",
    "Document ID: 1 title text question answer the of and to in is was for on with by",
    "0 1 2 3 4 5 6 7 8 9 10 + - * / = ( ) [ ] { } , . : ; ? ! ' \" \\frac \\sqrt x y z",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlvr.model.chat_template import TOOL_CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS_LINES * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = TOOL_CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: str | Path, seed: int = 0, vocab_size: int = 512) -> Path:
    """Write a tiny Qwen2-style model + tokenizer to `out_dir` (atomically) and return it."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return out
    tokenizer = _train_tokenizer(vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    # Sampling defaults like those Qwen2.5-Instruct ships: vLLM would apply them to every
    # request that does not set its own, so every test against this model checks that the
    # trainer's sampling parity holds (vf-vllm's --generation-config vllm, neutral filters).
    model.generation_config = GenerationConfig(
        eos_token_id=eos,
        pad_token_id=pad,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        repetition_penalty=1.3,
    )
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out


def build_tiny_adapter(
    model_dir: str | Path,
    out_dir: str | Path,
    rank: int = 8,
    seed: int = 0,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
) -> Path:
    """Write a LoRA adapter for the model at `model_dir` (with its tokenizer) to `out_dir`,
    atomically, and return it. A fresh adapter's B matrices are zero (it changes nothing);
    these are random, so serving or merging the adapter visibly changes what the model says.
    Every matrix is drawn from `seed` (peft draws A from the global generator, which would make
    the adapter depend on whatever ran before in the process)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / "adapter_config.json").is_file():
        return out
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets))
    peft = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_" in name:
                scale = 0.5 if "lora_B" in name else param.shape[-1] ** -0.5
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    with atomic_directory(out) as tmp:
        peft.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(tmp)
    return out
