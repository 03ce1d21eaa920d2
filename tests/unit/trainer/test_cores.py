"""batch.trainer_cores: the trainer process and every thread it has or starts run on the given
cores, with as many torch threads; cores the process may not use are refused; the pinning can
be undone (bench/train_step.py runs several trainers in one process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlvr.trainer.cores import pin_to_cores

PINNED = """
import os, threading, torch
from rlvr.trainer.cores import pin_to_cores, set_affinity
original = os.sched_getaffinity(0)
seen, pinned = [], threading.Event()
def look():
    pinned.wait()
    seen.append(os.sched_getaffinity(0))
early = threading.Thread(target=look)  # exists before the pinning, looks after it
early.start()
pin_to_cores([0])
pinned.set()
early.join()
late = threading.Thread(target=look)
late.start()
late.join()
print(sorted(os.sched_getaffinity(0)), torch.get_num_threads(), [sorted(s) for s in seen])
set_affinity(original)
print(os.sched_getaffinity(0) == original)
"""


@pytest.mark.slow
def test_every_thread_moves_to_the_cores_and_torch_uses_as_many_threads():
    done = subprocess.run([sys.executable, "-c", PINNED], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[0] 1 [[0], [0]]", "True"]


def test_cores_the_process_may_not_use_are_refused():
    with pytest.raises(ValueError, match=r"batch.trainer_cores=\[100000\]"):
        pin_to_cores([100000])
