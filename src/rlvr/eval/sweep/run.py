"""Running a sweep: recording its spec in `OUT/sweep.json` (refusing cells made with other
shared settings), then each missing cell's vf-eval run, renamed into place only once finished."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlvr.atomic import atomic_directory, atomic_write_text
from rlvr.eval.sweep.inputs import (
    CELLS,
    SPEC_FILE,
    Cell,
    ModelEntry,
    Setting,
    Shared,
    Sweep,
    SweepError,
    directory_name,
)
from rlvr.eval.vf_eval import run_vf_eval
from rlvr.server.serve_model import serve


def is_done(cell_dir: Path) -> bool:
    """A cell is finished when its directory exists (with its cell.json): the directory only
    appears, complete, once vf-eval has saved its results (see `_run_cell`)."""
    return (cell_dir / "cell.json").is_file()


def record_sweep(out: Path, sweep: Sweep) -> Sweep:
    """Record the sweep in OUT/sweep.json and return everything recorded there so far.

    The first run fixes the shared settings; later runs must share them, and may add models,
    settings or seeds (the record keeps the union, so a report covers every cell run into
    OUT). A label that comes back naming another model or other arguments is refused.
    """
    path = out / SPEC_FILE
    if path.is_file():
        recorded = load_sweep(out)
        old, new = asdict(recorded.shared), asdict(sweep.shared)
        changed = [k for k in new if old.get(k) != new[k]]
        if changed:
            details = "; ".join(f"{k}: was {old.get(k)!r}, now {new[k]!r}" for k in changed)
            raise SweepError(
                f"{out} holds a sweep run with other shared settings ({details}); "
                "use another --out or the same settings"
            )
        sweep = Sweep(
            sweep.shared,
            _union("model", recorded.models, sweep.models),
            _union("setting", recorded.settings, sweep.settings),
            list(dict.fromkeys([*recorded.seeds, *sweep.seeds])),
        )
    spec = {
        "shared": asdict(sweep.shared),
        "models": [asdict(m) for m in sweep.models],
        "settings": [asdict(s) for s in sweep.settings],
        "seeds": sweep.seeds,
    }
    atomic_write_text(path, json.dumps(spec, indent=2) + "\n")
    return sweep


def _union(kind: str, old: list[Any], new: list[Any]) -> list[Any]:
    """`old` then the entries of `new` it lacks, matched by label."""
    merged = {entry.label: entry for entry in old}
    for entry in new:
        if merged.setdefault(entry.label, entry) != entry:
            raise SweepError(
                f"{kind} label {entry.label!r} was {merged[entry.label]}, now {entry}; "
                "give it another label"
            )
    return list(merged.values())


def load_sweep(out: Path) -> Sweep:
    """The sweep recorded in `out` (every model, setting and seed run into it)."""
    path = out / SPEC_FILE
    if not path.is_file():
        raise SweepError(f"{out} holds no sweep ({SPEC_FILE} not found)")
    spec = json.loads(path.read_text())
    return Sweep(
        Shared(**spec["shared"]),
        [ModelEntry(**m) for m in spec["models"]],
        [Setting(**s) for s in spec["settings"]],
        spec["seeds"],
    )


@dataclass
class SweepRun:
    """What running a sweep did: cells run now, cells finished before, cells that failed."""

    ran: list[Cell] = field(default_factory=list)
    skipped: list[Cell] = field(default_factory=list)
    failed: list[tuple[Cell, str]] = field(default_factory=list)


def run_sweep(
    sweep: Sweep,
    out: Path,
    *,
    base_url: str | None = None,
    server_args: Sequence[str] = (),
    cell_timeout: float | None = None,
    progress: bool = True,
) -> SweepRun:
    """Run every unfinished cell, one model (and server) at a time.

    Without `base_url` each model with unfinished cells gets its own vf-vllm (started with
    `server_args`, stopped after its cells). A failing cell is recorded and the sweep goes on;
    so does a model whose server does not start (its cells fail).
    """
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    record_sweep(out, sweep)
    for stale in (out / CELLS).rglob(".tmp-*") if (out / CELLS).is_dir() else ():
        shutil.rmtree(stale, ignore_errors=True)  # an interrupted cell's partial output
    result = SweepRun()
    cells = sweep.cells
    result.skipped = [c for c in cells if is_done(c.directory(out))]
    bar = tqdm(
        total=len(cells), initial=len(result.skipped), desc="sweep", unit="cell",
        disable=not progress,
    )  # fmt: skip
    for model in sweep.models:
        pending = [c for c in cells if c.model == model and c not in result.skipped]
        if not pending:
            continue
        log = out / CELLS / directory_name(model.label) / "vf-vllm.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            try:
                endpoint = stack.enter_context(
                    serve(
                        model.model, name=model.label if base_url is None else None,
                        base_url=base_url, server_args=server_args, log_path=log,
                    )
                )  # fmt: skip
            except (RuntimeError, TimeoutError, OSError, ValueError) as e:
                result.failed += [
                    (c, f"server for {model.label} did not start: {e}") for c in pending
                ]
                bar.update(len(pending))
                continue
            for cell in pending:
                bar.set_postfix_str(cell.label)
                try:
                    _run_cell(sweep, cell, out, endpoint.base_url, endpoint.model, cell_timeout)
                    result.ran.append(cell)
                except Exception as e:  # recorded and reported; the sweep goes on
                    result.failed.append((cell, f"{type(e).__name__}: {e}"))
                bar.update(1)
    bar.close()
    return result


def _run_cell(
    sweep: Sweep, cell: Cell, out: Path, base_url: str, model: str, timeout: float | None
) -> None:
    """One vf-eval run, saved in a hidden directory that becomes the cell's once complete."""
    shared = sweep.shared
    env_args = sweep.env_args(cell)
    with atomic_directory(cell.directory(out)) as tmp:
        run_vf_eval(
            shared.env_id,
            model=model,
            base_url=base_url,
            output_dir=tmp,
            num_examples=shared.num_examples,
            rollouts_per_example=shared.rollouts_per_example,
            max_tokens=shared.max_tokens,
            env_args=env_args,
            sampling_args=shared.sampling_args or None,
            timeout=timeout,
        )
        record = {**asdict(cell), "served_model": model, "env_args": env_args}
        atomic_write_text(tmp / "cell.json", json.dumps(record, indent=2) + "\n")
