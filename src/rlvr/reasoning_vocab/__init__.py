"""The reasoning vocabulary: the mapping and checkpoint expansion, the think-span gate, and its
vLLM logits processor and tokenizer mode."""
