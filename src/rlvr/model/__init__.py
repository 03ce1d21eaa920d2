"""Models and tokenizers: loading, the policy with LoRA, merging, chat template, tiny model.

Models load from a hub id, a local dir or the embedded default."""
