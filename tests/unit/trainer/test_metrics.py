"""What a run shows on the console."""

from rlvr.trainer.metrics import step_line


def test_a_step_line_shows_the_reward_the_environments_metrics_kl_and_time():
    """Without a progress bar (log files, `make demo`) each GRPO step is one readable line;
    the environment's metrics say what the reward is made of."""
    metrics = {"reward/mean": 0.234375, "env/has_boxed": 0.921875, "env/correct": 0.234375,
               "mismatch_kl": 1.2e-11, "time/step": 15.84, "loss/pg": 0.1}  # fmt: skip
    assert step_line(3, 10, metrics) == (
        "step 3/10 | reward 0.234 | env/has_boxed 0.922  env/correct 0.234 | "
        "mismatch-KL 1.2e-11 | 15.8 s"
    )
    bare = {"reward/mean": 0.0, "mismatch_kl": 0.0, "time/step": 2.0}
    assert step_line(1, 1, bare) == "step 1/1 | reward 0.000 | mismatch-KL 0 | 2.0 s"
