"""How a step's samples are laid out in micro-batches, and the attention each layout needs.

The trainer calls `rlvr.layout.plan.plan_step` once per step. Modules: `micro_batches` (padded
and packed rows), `prefix_tree` (folding samples into prefix trees), `folded` (a folded
micro-batch's tensors and mask), `tree_sdpa` (its node-split attention), `attention` (which
models can take a tree's mask), `layout_check` (the start-up self-check). Design:
docs/training.md#how-the-micro-batch-layouts-work.
"""
