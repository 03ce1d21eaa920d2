"""vf-deepscaler: competition math with ``\\boxed{}`` answers, verified symbolically."""

from __future__ import annotations

import os

import verifiers as vf

from vf_deepscaler.dataset import DEFAULT_DATASET, DataFiles, DatasetFormatError, load_problems
from vf_deepscaler.generator import generate_problems
from vf_deepscaler.parser import BoxedAnswerParser, last_boxed
from vf_deepscaler.pool import Verdict, VerifierPool
from vf_deepscaler.rubric import DeepScaleRRubric
from vf_deepscaler.sampling import DefaultSampling

SYSTEM_PROMPT = (
    "Solve the following math problem. Reason step by step, then give the final answer "
    "in \\boxed{}."
)
THINK_SYSTEM_PROMPT = (
    "Solve the following math problem. Think it through between <think> and </think>, then, "
    "after </think>, give the final answer in \\boxed{}."
)


# Reply budget (measured by bench/reply_lengths.py with the embedded model's tokenizer): the
# reference solutions of the DeepScaleR rows take a median of 540 tokens and 1,088 at the 99th
# percentile (98.5% fit), so this fits honest reasoning while a model that never boxes an
# answer cannot ramble to the end of its context. `vf-eval -t` or the trainer's
# sampling.max_tokens override it.
DEFAULT_SAMPLING_ARGS = {"max_tokens": 1024}


class DeepScaleREnv(DefaultSampling, vf.SingleTurnEnv):
    """A single-turn math environment whose requests keep its default sampling arguments."""


def _default_prompt(use_think: bool) -> str:
    return THINK_SYSTEM_PROMPT if use_think else SYSTEM_PROMPT


def load_environment(
    dataset_name: str = DEFAULT_DATASET,
    data_files: DataFiles | None = None,
    split: str = "train",
    max_examples: int | None = None,
    eval_dataset_name: str | None = None,
    eval_data_files: DataFiles | None = None,
    eval_split: str = "test",
    system_prompt: str | None = None,
    use_think: bool = False,
    think_format_weight: float = 0.1,
    verify_timeout_s: float = 5.0,
    verify_workers: int | None = None,
    seed: int = 0,
) -> DeepScaleREnv:
    """A single-turn math environment; see the package README for every argument.

    Training rows come from ``data_files`` (local jsonl/json/parquet) or else ``dataset_name``
    on the hub; evaluation rows from ``eval_data_files`` / ``eval_dataset_name`` when given (else
    verifiers evaluates on the training rows). A hub source that cannot be reached is replaced by
    problems the package generates (deterministic in ``seed``), with a warning in the log.
    """
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be >= 1 or None, got {max_examples}")
    dataset = load_problems(
        dataset_name=dataset_name,
        data_files=data_files,
        split=split,
        max_examples=max_examples,
        seed=seed,
        stream="train",
    )
    eval_dataset = None
    if eval_data_files is not None or eval_dataset_name is not None:
        eval_dataset = load_problems(
            dataset_name=eval_dataset_name,
            data_files=eval_data_files,
            split=eval_split,
            max_examples=max_examples,
            seed=seed,
            stream="eval",
        )
    parser = BoxedAnswerParser(use_think=use_think)
    rubric = DeepScaleRRubric(
        parser=parser,
        verify_timeout_s=verify_timeout_s,
        verify_workers=verify_workers or min(4, os.cpu_count() or 1),
        use_think=use_think,
        think_format_weight=think_format_weight,
    )
    return DeepScaleREnv(
        dataset=dataset,
        eval_dataset=eval_dataset,
        system_prompt=_default_prompt(use_think) if system_prompt is None else system_prompt,
        parser=parser,
        rubric=rubric,
        sampling_args=DEFAULT_SAMPLING_ARGS,
    )


__all__ = [
    "BoxedAnswerParser",
    "DEFAULT_DATASET",
    "DEFAULT_SAMPLING_ARGS",
    "DatasetFormatError",
    "DeepScaleREnv",
    "DeepScaleRRubric",
    "Verdict",
    "VerifierPool",
    "generate_problems",
    "last_boxed",
    "load_environment",
]
