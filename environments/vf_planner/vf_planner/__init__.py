"""vf_planner: a trained planner decomposes GSM8K problems, a frozen worker model solves the parts.

The policy is the planner: one reply with a JSON plan (single turn). The rubric runs the worker
pipeline on that plan (worker replies never enter the policy's trajectory, so they get no loss;
the worker sees only what the plan gives it) and scores correctness, token efficiency against a
per-problem direct-solve baseline, and independence: the share of subproblems that computed a new
intermediate result. See README.md for the formula, its range and a worked example.
"""

from __future__ import annotations

import verifiers as vf

from vf_planner.dataset import load_planner_dataset
from vf_planner.independence import Independence, independence
from vf_planner.pipeline import Outcome, PlannerPipeline
from vf_planner.plan import Plan, PlanError, PlanParser, parse_plan
from vf_planner.prompts import planner_system
from vf_planner.rubric import PlannerRubric, RewardWeights, efficiency, reward_components
from vf_planner.sampling import DefaultSampling
from vf_planner.worker import Worker, WorkerError, WorkerPool, WorkerSettings

# The planner's reply budget (bench/reply_lengths.py, embedded model's tokenizer): a plan with one
# subproblem per step of the GSM8K reference solution takes a median of 110 tokens, 213 at the
# 99th percentile. `vf-eval -t` or the trainer's sampling.max_tokens override it; the worker's
# budget is `worker_max_tokens`.
DEFAULT_SAMPLING_ARGS = {"max_tokens": 512}


class PlannerEnv(DefaultSampling, vf.SingleTurnEnv):
    """The planner's single turn, whose requests keep the default sampling arguments."""


def load_environment(
    dataset_name: str = "openai/gsm8k",
    dataset_config: str | None = "main",
    data_files: str | list[str] | None = None,
    split: str = "train",
    max_examples: int = -1,
    worker_model: str | None = None,
    worker_base_url: str | None = None,
    worker_api_key_var: str = "WORKER_API_KEY",
    worker_temperature: float = 0.0,
    worker_max_tokens: int = 512,
    worker_timeout: float = 300.0,
    max_concurrent_worker_calls: int = 32,
    max_subproblems: int = 4,
    correctness_weight: float = 1.0,
    token_weight: float = 0.2,
    independence_weight: float = 0.3,
    seed: int | None = None,
) -> PlannerEnv:
    """The planner environment (a SingleTurnEnv whose rubric runs the frozen worker).

    worker_base_url=None sends worker requests to the server that serves the policy, with the
    same client; worker_model=None asks that server for the policy's base model (the `parent` of
    a LoRA adapter in vLLM's /v1/models). Give both to use a separate worker server.
    """
    if max_subproblems < 1:
        raise ValueError(f"max_subproblems must be >= 1, got {max_subproblems}")
    if worker_max_tokens < 1 or worker_timeout <= 0 or max_concurrent_worker_calls < 1:
        raise ValueError(
            "worker_max_tokens, worker_timeout and max_concurrent_worker_calls must be positive, "
            f"got {worker_max_tokens}, {worker_timeout}, {max_concurrent_worker_calls}"
        )
    weights = RewardWeights(correctness_weight, token_weight, independence_weight)
    dataset = load_planner_dataset(
        dataset_name, dataset_config, data_files, split, max_examples, seed
    )
    workers = WorkerPool(
        WorkerSettings(
            model=worker_model,
            base_url=worker_base_url,
            api_key_var=worker_api_key_var,
            temperature=worker_temperature,
            max_tokens=worker_max_tokens,
            timeout=worker_timeout,
            max_concurrent=max_concurrent_worker_calls,
        )
    )
    parser = PlanParser(max_subproblems)
    env = PlannerEnv(
        dataset=dataset,
        system_prompt=planner_system(max_subproblems),
        parser=parser,
        rubric=PlannerRubric(PlannerPipeline(parser, workers), weights),
        sampling_args=DEFAULT_SAMPLING_ARGS,
    )
    # Read by trainers (rlvr): without worker_base_url the frozen worker is the base model of
    # the policy's own server, which stays frozen only if training pushes an adapter (served
    # under its own name) rather than merged weights into that server.
    env.frozen_model_on_policy_server = worker_base_url is None
    return env


__all__ = [
    "DEFAULT_SAMPLING_ARGS",
    "Independence",
    "Outcome",
    "Plan",
    "PlanError",
    "PlanParser",
    "PlannerEnv",
    "PlannerPipeline",
    "PlannerRubric",
    "RewardWeights",
    "Worker",
    "WorkerError",
    "WorkerPool",
    "WorkerSettings",
    "efficiency",
    "independence",
    "load_environment",
    "load_planner_dataset",
    "parse_plan",
    "reward_components",
]
