"""Mutation testing of the loss path: wrong formulas that the unit tests must reject.

Each `Mutant` is one small edit of a file under `src/` (a formula as someone might get it
wrong); `verdicts` applies each to a copy of `src/` and runs the unit tests that guard it,
and a mutant whose tests still pass survives. Each run is a child forked from this process
after the heavy imports (`WARM`), with `rlvr` and the test modules imported afresh from the
copy, so a mutant costs its tests and the project's own imports (about a second).

`tests/unit/trainer/test_mutants.py` runs every mutant against its killing tests in the
suite; `make mutants` runs every mutant against the whole loss-path test files.
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TRAINER = "tests/unit/trainer"
LOSS = f"{TRAINER}/test_loss.py"
BATCH = f"{TRAINER}/test_train_batch.py"
DISTILL = f"{TRAINER}/test_distill.py"
FILES = [LOSS, BATCH, DISTILL, "tests/unit/layout/test_micro_batches.py"]
"""The loss path's test files (what `make mutants` runs against every mutant)."""
WARM = [
    "rlvr.trainer.grpo",
    "rlvr.model.tiny_model",
    "rlvr.server.process",
    "transformers.models.qwen2.modeling_qwen2",
    "pytest",
]
"""Imported before the children fork: their third-party imports (torch, transformers,
accelerate, verifiers, ...) are what a child would spend most of its time on; each child
imports `rlvr` itself afresh, from the mutated copy."""


@dataclass(frozen=True)
class Mutant:
    """`old` replaced by `new` (exactly once) in `path`, which the tests `killers` (pytest
    node ids or files, relative to the repository) must fail."""

    name: str
    path: str
    old: str
    new: str
    killers: tuple[str, ...]


MUTANTS = [
    Mutant(
        "clip_low and clip_high swapped",
        "src/rlvr/trainer/loss.py",
        "low = 1.0 - (cfg.clip_low if cfg.clip_low is not None else math.inf)\n"
        "        high = 1.0 + (cfg.clip_high if cfg.clip_high is not None else math.inf)",
        "low = 1.0 - (cfg.clip_high if cfg.clip_high is not None else math.inf)\n"
        "        high = 1.0 + (cfg.clip_low if cfg.clip_low is not None else math.inf)",
        (f"{LOSS}::test_asymmetric_clipping_bounds_each_side_by_its_own_setting",),
    ),
    Mutant(
        "sequence mask bounds the arithmetic mean ratio",
        "src/rlvr/trainer/loss.py",
        "rollout_log_ratio = sequence_means(token_log_ratio.detach(), mask, sequence_ids)",
        "rollout_log_ratio = sequence_means(token_log_ratio.detach().exp(), mask, sequence_ids)"
        ".log()",
        (f"{LOSS}::test_loss_variants_match_reference_formulas",),
    ),
    Mutant(
        "seq_mean_token_mean normalised by every rollout, loss tokens or not",
        "src/rlvr/batch.py",
        "            for i, s in enumerate(self.samples)\n            if s.num_loss_tokens\n",
        "            for i, s in enumerate(self.samples)\n",
        (f"{LOSS}::test_sequence_losses_weigh_rollouts_not_pieces",),
    ),
    Mutant(
        "the token count passed as the sequence count",
        "src/rlvr/trainer/loss.py",
        "loss_normaliser(cfg, batch.loss_tokens, batch.loss_sequences, max_seq_len)",
        "loss_normaliser(cfg, batch.loss_tokens, batch.loss_tokens, max_seq_len)",
        (f"{LOSS}::test_sequence_losses_weigh_rollouts_not_pieces",),
    ),
    Mutant(
        "overlong length from all turns",
        "src/rlvr/rollouts/to_samples.py",
        "longest_reply=max((r.tokens for r in replies), default=0),",
        "longest_reply=sum(r.tokens for r in replies),",
        (f"{BATCH}::test_overlong_penalty_counts_cut_replies",),
    ),
    Mutant(
        "overlong length of what is left of a cut turn",
        "src/rlvr/trainer/advantages.py",
        "length = reply_cap if rollout.capped_reply else rollout.longest_reply",
        "length = rollout.longest_reply",
        (f"{BATCH}::test_overlong_penalty_counts_cut_replies",),
    ),
    Mutant(
        "overlong length of what is left of a turn cut to max_seq_len",
        "src/rlvr/rollouts/to_samples.py",
        "return TurnReply(len(kept if generated is None else generated), finished_at_cap)",
        "return TurnReply(len(kept), finished_at_cap)",
        (f"{BATCH}::test_overlong_penalty_measures_the_reply_not_the_cut",),
    ),
    Mutant(
        "a turn cut to max_seq_len counted as reaching the cap",
        "src/rlvr/rollouts/to_samples.py",
        'finished_at_cap = _field(message, "finish_reason") == "length"',
        'finished_at_cap = bool(step.get("is_truncated"))',
        (f"{BATCH}::test_overlong_penalty_measures_the_reply_not_the_cut",),
    ),
    Mutant(
        "overlong penalty scaled by the group's std",
        "src/rlvr/trainer/advantages.py",
        "shaped = [a - p for a, p in zip(shaped, centred(penalties[index]), strict=True)]",
        "shaped = [a - p for a, p in zip(shaped, centred(penalties[index], scale_rewards), "
        "strict=True)]",
        (f"{BATCH}::test_overlong_penalty_is_linear_in_flat_groups",),
    ),
    Mutant(
        "overlong penalty left out of flat groups",
        "src/rlvr/trainer/advantages.py",
        "        if penalties is not None:\n",
        "        if penalties is not None and not flat:\n",
        (f"{BATCH}::test_overlong_penalty_is_linear_in_flat_groups",),
    ),
    Mutant(
        "each sample its own sequence in GSPO and MIS",
        "src/rlvr/layout/micro_batches.py",
        'key = ("sample", index) if s.rollout is None else ("rollout", s.rollout)',
        'key = ("sample", index)',
        (f"{LOSS}::test_sequence_losses_weigh_rollouts_not_pieces",),
    ),
    Mutant(
        "seq_mean_token_mean divides by the rollout's tokens in the micro-batch",
        "src/rlvr/trainer/loss.py",
        "loss_sum = (per_token * keep / rollout_tokens.clamp(min=1)).sum()",
        "loss_sum = (per_token * keep / per_sequence(mask, sequence_ids).clamp(min=1)).sum()",
        (f"{LOSS}::test_sequence_losses_weigh_rollouts_not_pieces",),
    ),
    Mutant(
        "a masked ratio's overflow reaches the loss",
        "src/rlvr/trainer/loss.py",
        "ratio = torch.exp(torch.where(in_bounds, log_ratio, 0.0))",
        "ratio = torch.exp(log_ratio)",
        (f"{LOSS}::test_a_masked_ratio_that_overflows_exp_stays_out_of_the_loss",),
    ),
    Mutant(
        "TIS weight floored instead of truncated",
        "src/rlvr/trainer/loss.py",
        "weight = ratio.detach().clamp(max=cfg.tis_cap)",
        "weight = ratio.detach().clamp(min=cfg.tis_cap)",
        (f"{LOSS}::test_loss_variants_match_reference_formulas",),
    ),
    Mutant(
        "GSPO takes the token ratio's value",
        "src/rlvr/trainer/loss.py",
        "log_ratio = rollout_log_ratio + logprobs - logprobs.detach()",
        "log_ratio = token_log_ratio",
        (f"{LOSS}::test_loss_variants_match_reference_formulas",),
    ),
    Mutant(
        "the distillation term's sign flipped (forward, not reverse, direction)",
        "src/rlvr/trainer/advantages.py",
        "coef * (teacher - sampler) if mask else 0.0",
        "coef * (sampler - teacher) if mask else 0.0",
        (f"{DISTILL}::test_distill_advantage_is_teacher_minus_sampler_logprob",),
    ),
    Mutant(
        "the distillation term without its coefficient",
        "src/rlvr/trainer/advantages.py",
        "coef * (teacher - sampler) if mask else 0.0",
        "(teacher - sampler) if mask else 0.0",
        (f"{DISTILL}::test_distill_advantage_is_teacher_minus_sampler_logprob",),
    ),
    Mutant(
        "the distillation term dropped by the collation",
        "src/rlvr/layout/micro_batches.py",
        "advantages[r, start:end] += torch.tensor(s.token_advantages)",
        "pass",
        (f"{DISTILL}::test_distill_advantage_is_teacher_minus_sampler_logprob",),
    ),
    Mutant(
        "pure distillation keeps the group advantages",
        "src/rlvr/trainer/train_batch.py",
        "advantages = [[0.0] * len(group) for group in advantages]",
        "pass",
        (f"{DISTILL}::test_distill_advantage_is_teacher_minus_sampler_logprob",),
    ),
    Mutant(
        "a teacher's flat groups dropped anyway",
        "src/rlvr/trainer/train_batch.py",
        "if is_flat and cfg.loss.drop_zero_variance and distill is None:",
        "if is_flat and cfg.loss.drop_zero_variance:",
        (f"{DISTILL}::test_a_teacher_keeps_groups_whose_rewards_are_equal",),
    ),
]
"""The five wrong formulas of issue 48 first, then others of their kind."""


def copy_sources(into: Path) -> Path:
    """A copy of the repository's `src/` under `into` (without bytecode)."""
    target = into / "src"
    shutil.copytree(ROOT / "src", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def run_tests(src: Path, tests: list[str]) -> int:
    """pytest's exit code for `tests`, run in a child forked from this process with `rlvr`
    and the test modules imported from `src`."""
    gc.freeze()  # the child's collections then leave the parent's heap alone (no copy on write)
    pid = os.fork()
    if pid:
        status = os.waitpid(pid, 0)[1]
        gc.unfreeze()
        return os.waitstatus_to_exitcode(status)
    code = 3
    try:
        import pytest

        sys.dont_write_bytecode = True  # a mutant and its original may share size and mtime
        fresh = ("rlvr", "unit", "tests", "conftest", "support", "toy_env", "hosts")
        for name in [n for n in sys.modules if n.split(".")[0] in fresh]:
            del sys.modules[name]
        sys.path.insert(0, str(src))
        quiet = os.open(os.devnull, os.O_WRONLY)  # a verdict is the exit code
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        args = ["-q", "-x", "-p", "no:cacheprovider", "-p", "no:unraisableexception"]
        args += ["-W", "ignore::pytest.PytestConfigWarning", "--rootdir", str(ROOT)]
        code = pytest.main([*args, *(str(ROOT / t) for t in tests)])
    finally:
        os._exit(int(code))


def mutate(src: Path, mutant: Mutant) -> str:
    """Apply `mutant` to the copy at `src`; return the file's original text."""
    path = src.parent / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise ValueError(f"mutant {mutant.name!r}: its text is not found once in {mutant.path}")
    path.write_text(text.replace(mutant.old, mutant.new))
    return text


def verdicts(mutants: list[Mutant], full: bool = False) -> dict[str, bool]:
    """Whether each of the `mutants` dies (by name): its tests fail against it (its killers,
    or with `full` all of `FILES`). Raises if the tests fail on the unmutated copy (then no
    death would mean anything) or a run errs (pytest's exit codes other than 0 and 1)."""
    for module in WARM:  # what the tests import besides rlvr, once, before the children fork
        importlib.import_module(module)
    with tempfile.TemporaryDirectory(prefix="rlvr-mutants-") as tmp:
        src = copy_sources(Path(tmp))
        killers = sorted({t for m in mutants for t in m.killers})
        if run_tests(src, FILES if full else killers) != 0:
            raise RuntimeError("the loss path's tests fail without a mutant")
        dead = {}
        for mutant in mutants:
            original = mutate(src, mutant)
            try:
                code = run_tests(src, FILES if full else list(mutant.killers))
            finally:
                (src.parent / mutant.path).write_text(original)
            if code not in (0, 1):
                raise RuntimeError(f"mutant {mutant.name!r}: pytest exited {code}")
            dead[mutant.name] = code == 1
        return dead


def main() -> None:
    """`make mutants`: every mutant against the loss path's whole test files."""
    dead = verdicts(MUTANTS, full=True)
    for name, died in dead.items():
        print(f"{'killed  ' if died else 'SURVIVED'} {name}")
    print(f"{sum(dead.values())} of {len(dead)} mutants killed")
    sys.exit(0 if all(dead.values()) else 1)


if __name__ == "__main__":
    main()
