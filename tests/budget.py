"""The suite's duration budget: a test whose call takes over BUDGET_S on the 2-core CI machine
is shortened, or listed in LONG with the reason it needs the time. Fixture set-ups (a server
start, about 45-65 s) fall on whichever test first asks for the fixture and are shared, so
they are left to `--durations`.

The check reports and never fails a test: a failure that depends on the machine's speed would
be a timing-dependent test. At the end of a run, pytest's summary names every test over the
budget that LONG does not list (`over the 60 s budget`); `tests/unit/test_budget.py` holds LONG
to tests that exist and to at most MAX_LONG entries, so the list cannot grow silently.
Measured durations: docs/benchmarks.md#tests.
"""

from __future__ import annotations

BUDGET_S = 60.0
MAX_LONG = 12

# (file under tests/, test function) -> why it needs more than BUDGET_S
LONG: dict[tuple[str, str], str] = {
    ("integration/test_demo.py", "test_make_demo_runs_every_stage_and_reports_before_and_after"): (
        "`make demo` as users run it: its own server, a push and restore, three evaluations, "
        "SFT and GRPO subprocesses"
    ),
    ("integration/test_distributed.py", "test_zero3_two_ranks_train_push_checkpoint_and_resume"): (
        "two ZeRO-3 trainer processes (gloo) train, push, checkpoint and resume"
    ),
    (
        "integration/test_prefix_tree.py",
        "test_prefix_sharing_zero3_two_ranks_pushes_the_unshared_runs_weights",
    ): ("two ZeRO-3 runs, with and without prefix sharing, compared weight by weight"),
    ("integration/test_adapter_sync.py", "test_adapter_sync_grpo_raises_reward"): (
        "GRPO through adapter pushes until the reward rises: learning, not only stages"
    ),
    ("integration/test_sweep.py", "test_sweep_2x2_on_the_tiny_server"): (
        "four vf-eval processes (at once: --jobs 4), then the same sweep again to see it resume"
    ),
    ("integration/test_readme_commands.py", "test_readme_quickstart_vf_eval_line_runs"): (
        "every README line starts at once on the shared server; the first to be checked waits "
        "while all of them share the two cores (the rest are then done)"
    ),
    ("environments/test_planner.py", "test_planner_delegated_decomposition_does_not_pay"): (
        "plays the audit corpus (1,620 plans, honest and exploit) through the environment with "
        "the trusting scripted worker; the module's other audits read these plays"
    ),
    ("environments/test_planner.py", "test_planner_rules_hold_for_both_workers"): (
        "plays the same corpus again with the re-solving worker (the rules must hold for both)"
    ),
    ("integration/test_qlora.py", "test_qlora_sampler_matches_trainer"): (
        "SmolLM2 quantized to 4 bits, trained and pushed, compared with the server"
    ),
}


def base_id(nodeid: str) -> tuple[str, str]:
    """A pytest node id as LONG keys it: (`tests/a.py::test_x[1]` -> (`a.py`, `test_x`))."""
    path, _, name = nodeid.split("[", 1)[0].partition("::")
    return path.removeprefix("tests/"), name


def over_budget(durations: dict[str, float]) -> list[tuple[str, float]]:
    """The tests (node ids) over BUDGET_S that LONG does not list, slowest first."""
    slowest = sorted(durations.items(), key=lambda item: -item[1])
    return [(n, s) for n, s in slowest if s > BUDGET_S and base_id(n) not in LONG]
