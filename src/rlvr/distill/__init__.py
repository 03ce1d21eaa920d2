"""On-policy distillation: a served teacher scores every token the student sampled
(`teacher.Teacher`); the trainer turns the scores into a per-token advantage
(`rlvr.trainer.advantages.distill_advantages`). Design: docs/training.md#on-policy-distillation.
"""
