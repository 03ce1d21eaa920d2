"""Checkpoints that resume a run exactly, written atomically, the last K kept.

`checkpoints/step_000012` (12 steps done) holds accelerate's state (weights, optimizer, LR
scheduler, every process's RNG), `trainer_state.json` (step, data position, weight version, W&B
run id) and, for asynchronous runs, the batches in flight. It is published
whole (`rlvr.atomic.publish_directory`, `trainer_state.json` last), so a crash mid-save leaves
the previous checkpoint the latest valid one. See docs/training.md#resuming-asynchronous-runs.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

from rlvr import batch
from rlvr.atomic import atomic_write_text, publish_directory

STATE_FILE = "trainer_state.json"
IN_FLIGHT_FILE = "in_flight_batches.pkl"
PREFIX = "step_"


def checkpoints_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def checkpoint_path(output_dir: str | Path, step: int) -> Path:
    return checkpoints_root(output_dir) / f"{PREFIX}{step:06d}"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.glob(f"{PREFIX}*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix(PREFIX)))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume(resume: str | None, output_dir: str | Path) -> Path | None:
    """`auto` -> the latest checkpoint of this output dir (None on a fresh run); a path ->
    that checkpoint, which must exist and be complete."""
    if resume is None:
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"checkpoint.resume={resume!r}: no {STATE_FILE} in {path}")
    return path


def save_checkpoint(
    accelerator: Any,
    output_dir: str | Path,
    state: dict,
    keep_last: int,
    in_flight: list | None = None,
) -> Path:
    """Save on every process (DeepSpeed writes per-rank shards), publish on the main one
    (which also writes `in_flight`, the main process's rollout batches in flight)."""
    step = int(state["step"])
    final = checkpoint_path(output_dir, step)
    tmp = final.parent / f".tmp-{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if in_flight:
            (tmp / IN_FLIGHT_FILE).write_bytes(pickle.dumps(in_flight))
        atomic_write_text(tmp / STATE_FILE, json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        publish_directory(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def trainable_names(accelerator: Any, model: Any) -> set[str]:
    return {n for n, p in accelerator.unwrap_model(model).named_parameters() if p.requires_grad}


def keep_trainable_only(accelerator: Any) -> None:
    """Make checkpoints hold only trainable parameters: a LoRA checkpoint is then the adapter
    (MBs) rather than the frozen base model again (GBs); the base comes from the model itself on
    resume. (DeepSpeed writes its own files and is not affected.)"""

    def hook(models: list, weights: list[dict], _output_dir: str) -> None:
        if not weights:  # DeepSpeed: the engine saves its own state
            return
        for model, state in zip(models, weights, strict=True):
            keep = trainable_names(accelerator, model)
            for key in [k for k in state if k not in keep]:
                del state[key]

    accelerator.register_save_state_pre_hook(hook)


def load_checkpoint(accelerator: Any, path: str | Path, model: Any, deepspeed: bool) -> dict:
    """Restore model/optimizer/scheduler/RNG into the prepared objects; return the trainer
    state (step, data position, ...). The model file holds only trainable parameters (see
    `keep_trainable_only`), so it loads non-strictly, after checking that none is missing."""
    path = Path(path)
    if deepspeed:
        accelerator.load_state(str(path))
    else:
        weights = path / "model.safetensors"
        if weights.is_file():
            from safetensors import safe_open

            with safe_open(str(weights), "pt") as f:
                missing = trainable_names(accelerator, model) - set(f.keys())
            if missing:
                raise ValueError(
                    f"checkpoint {path} lacks {len(missing)} trainable parameters of this model "
                    f"(e.g. {sorted(missing)[0]}): was it saved with another LoRA/model config?"
                )
        accelerator.load_state(str(path), strict=False)
    return json.loads((path / STATE_FILE).read_text())


_NOUNS = {"Sample", "RolloutResult", "GroupResult", "StepBatch"}


class _InFlightUnpickler(pickle.Unpickler):
    """Reads the step's nouns from `rlvr.batch` whatever module wrote them: checkpoints saved
    before they moved there name `rlvr.trainer.micro_batches.Sample` and the like."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("rlvr.") and name in _NOUNS:
            return getattr(batch, name)
        return super().find_class(module, name)


def load_in_flight(path: str | Path) -> list:
    """The rollout batches a checkpoint kept (empty for synchronous runs). Pickle: the file
    is the run's own, written by `save_checkpoint`."""
    file = Path(path) / IN_FLIGHT_FILE
    if not file.is_file():
        return []
    with file.open("rb") as f:
        return _InFlightUnpickler(f).load()
