"""The evaluation and checkpoint cadence both trainers share."""

from __future__ import annotations

from rlvr.trainer.cadence import Schedule, run_steps


def events(schedule: Schedule, start: int = 0, stop_after: int | None = None):
    log: list[str] = []
    history: list[dict[str, float]] = []
    finished = run_steps(
        schedule,
        start,
        stop_after,
        history,
        lambda s: log.append(f"train {s}") or {"step": s},
        lambda s: log.append(f"eval {s}"),
        lambda s: log.append(f"save {s}"),
    )
    return log, history, finished


def test_cadence_with_the_last_step_saved_and_evaluated_once():
    log, history, finished = events(Schedule(4, 2, 2, eval_at_start=True, eval_at_end=True))
    assert log == [
        "eval 0", "train 0", "train 1", "eval 2", "save 2", "train 2", "train 3", "save 4",
        "eval 4",
    ]  # fmt: skip
    assert finished and [h["step"] for h in history] == [0, 1, 2, 3]


def test_off_cadence_end_is_still_saved_and_end_eval_is_optional():
    log, _, _ = events(Schedule(3, 0, 2, eval_at_start=False, eval_at_end=False))
    assert log == ["train 0", "train 1", "save 2", "train 2", "save 3"]


def test_a_stop_saves_where_it_stopped_and_a_resume_skips_the_start_eval():
    log, _, finished = events(Schedule(5, 0, 0, True, True), stop_after=2)
    assert log == ["eval 0", "train 0", "train 1", "save 2"] and not finished
    log, _, finished = events(Schedule(5, 0, 0, True, True), start=2)
    assert log == ["train 2", "train 3", "train 4", "eval 5", "save 5"] and finished
