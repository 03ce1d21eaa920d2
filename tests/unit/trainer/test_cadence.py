"""The evaluation and checkpoint cadence both trainers share, played through each trainer's own
`run` loop (setup and the step's work replaced by a log of what the loop called)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlvr.trainer.grpo import Trainer
from rlvr.trainer.sft import SFTTrainer


def grpo_trainer(total: int, eval_every: int, save_every: int, eval_at_start: bool, log):
    trainer = Trainer.__new__(Trainer)
    trainer.cfg = SimpleNamespace(
        max_steps=total,
        eval=SimpleNamespace(every=eval_every, at_start=eval_at_start),
        checkpoint=SimpleNamespace(every=save_every),
    )
    trainer.close = lambda: None
    return trainer


def sft_trainer(total: int, eval_every: int, save_every: int, eval_at_start: bool, log):
    trainer = SFTTrainer.__new__(SFTTrainer)
    trainer.cfg = SimpleNamespace(
        train=SimpleNamespace(eval_every=eval_every),
        checkpoint=SimpleNamespace(every=save_every),
    )
    trainer.total_steps = total
    trainer.logger = SimpleNamespace(print=lambda *_: None, close=lambda: None)
    return trainer


@pytest.fixture(params=["grpo", "sft"])
def run(request):
    """Runs a trainer of the parametrised kind; returns (log, history) of what its loop did."""

    def play(total, eval_every, save_every, eval_at_start=True, start=0, stop_after=None):
        log: list[str] = []
        make = grpo_trainer if request.param == "grpo" else sft_trainer
        trainer = make(total, eval_every, save_every, eval_at_start, log)
        trainer.setup = lambda: None
        trainer.start_step, trainer.history = start, []
        trainer.train_step = lambda s: log.append(f"train {s}") or {"step": s}
        trainer.evaluate = lambda s: log.append(f"eval {s}")
        trainer.save = lambda s: log.append(f"save {s}")
        trainer.save_final = lambda: log.append("final")
        history = trainer.run(stop_after=stop_after)
        return log, history

    play.kind = request.param
    return play


def test_cadence_with_the_last_step_saved_and_evaluated_once(run):
    log, history = run(4, 2, 2)
    assert log == [
        "eval 0",
        "train 0",
        "train 1",
        "eval 2",
        "save 2",
        "train 2",
        "train 3",
        "save 4",
        "eval 4",
        "final",
    ]
    assert [h["step"] for h in history] == [0, 1, 2, 3]


def test_off_cadence_end_is_still_saved_and_end_eval_is_optional(run):
    if run.kind == "grpo":  # GRPO evaluates at the end only when it evaluates at all
        log, _ = run(3, 0, 2, eval_at_start=False)
        assert log == ["train 0", "train 1", "save 2", "train 2", "save 3", "final"]
    else:  # SFT always evaluates first and last (a no-op without a validation set)
        log, _ = run(3, 0, 2)
        assert log == [
            "eval 0",
            "train 0",
            "train 1",
            "save 2",
            "train 2",
            "eval 3",
            "save 3",
            "final",
        ]


def test_a_stop_saves_where_it_stopped_and_a_resume_skips_the_start_eval(run):
    log, _ = run(5, 5, 0, stop_after=2)
    assert log == ["eval 0", "train 0", "train 1", "save 2"]
    log, _ = run(5, 5, 0, start=2)
    assert log == ["train 2", "train 3", "train 4", "eval 5", "save 5", "final"]
