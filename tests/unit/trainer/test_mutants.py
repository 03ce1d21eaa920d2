"""The loss path's unit tests kill every wrong formula of `mutants.MUTANTS`."""

from __future__ import annotations

import pytest

from .mutants import MUTANTS, verdicts


@pytest.mark.slow
def test_loss_mutants_die():
    """Each mutant, applied to a copy of src/, fails the tests that guard its formula (clip
    bounds swapped, the sequence mask on the arithmetic mean, seq_mean_token_mean over every
    rollout, the token count as the sequence count, the overlong length over all turns, and
    others of their kind); the tests pass on the unmutated copy. `make mutants` runs every
    mutant against the whole test files of the loss path."""
    dead = verdicts(MUTANTS)
    assert [name for name, died in dead.items() if not died] == []
    assert len(dead) == len(MUTANTS)
