"""`sampling.*`, and the rule of which sampling the trainer can reproduce.

The trainer's log-probabilities are the temperature-scaled softmax of its logits, so a request
that filters, penalises or constrains tokens, or samples at another temperature, is refused with
SamplingFilterError; every request states the neutral values. The rollouts build requests with
`rlvr.rollouts.request_args`. Design: docs/training.md#sampling-parity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr.config.checks import ConfigError, require

# Fields that reshape the distribution, with their neutral value; each request sends these
# (OpenAI's own fields at the top level, vLLM's in extra_body).
NEUTRAL_OPENAI = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
NEUTRAL_VLLM = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
# Fields that reshape it whenever they are set to anything but empty/zero.
REFUSED_WHEN_SET = (
    "logit_bias",
    "min_tokens",
    "allowed_token_ids",
    "bad_words",
    # constrained decoding (vLLM's current and older spellings)
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_whitespace_pattern",
    "structural_tag",
    # another draw than sampling from the softmax: beams, a watermark's biased token lists
    "use_beam_search",
    "watermarking",
)
# Fields that reshape it whenever they are present, 0 included (a budget of 0 thinking tokens
# forces the end of the thinking span at once).
REFUSED_WHEN_PRESENT = ("thinking_token_budget",)
# Values of these fields that leave the distribution alone; any other value constrains it.
NEUTRAL_CHOICES = {"response_format": (None, "text"), "tool_choice": (None, "auto", "none")}


class SamplingFilterError(ValueError):
    """A sampling field the trainer's log-probabilities cannot reproduce."""


@dataclass
class SamplingConfig:
    """`sampling.*`: the sampling arguments every rollout request carries."""

    temperature: float = 1.0
    """Sampling temperature; the trainer divides its logits by the same value."""
    top_p: float = 1.0
    """Must stay 1.0: the trainer's log-probabilities cover the whole distribution, so a
    nucleus-filtered sampler would bias the importance ratio."""
    max_tokens: int | None = None
    """Most tokens per model turn. None: the environment's own default (its
    `sampling_args["max_tokens"]`, which each environment's README states), else 512. A value
    set here (file or `sampling.max_tokens=N`) wins over the environment's."""
    seed_requests: bool = True
    """Give each request a seed derived from (seed, step, rollout), so runs (and resumed runs)
    sample the same tokens. vLLM 0.32's CPU backend crashes when a seeded request's prefill is
    split into chunks (its CPU generators cannot rewind), so CPU servers with long prompts or
    many concurrent requests need `false` (see configs/examples/deepscaler_smollm2_cpu.yaml)."""
    extra_body: dict[str, Any] = field(default_factory=dict)
    """Extra vLLM request fields (e.g. `stop`, `skip_special_tokens`). Fields that reshape the
    distribution (top_k, min_p, penalties, logit_bias, min_tokens, ...), and a temperature
    other than `temperature`, are refused at start: the trainer could not reproduce them in its
    log-probabilities."""

    def validate(self) -> None:
        require(self.temperature > 0, "sampling.temperature", self.temperature)
        require(
            self.max_tokens is None or self.max_tokens >= 1, "sampling.max_tokens", self.max_tokens
        )
        try:
            check_run_sampling(self)
        except SamplingFilterError as e:
            raise ConfigError(str(e)) from None


def _is_neutral(key: str, value: Any) -> bool:
    if value is None:
        return True
    if key == "top_k":
        return value in (-1, 0)
    neutral = {**NEUTRAL_OPENAI, **NEUTRAL_VLLM}[key]
    return float(value) == neutral


def _choice(value: Any) -> Any:
    """`response_format={"type": "text"}` and `"text"` say the same; compare the type."""
    return value.get("type") if isinstance(value, dict) and "type" in value else value


def unreproducible(args: dict[str, Any]) -> dict[str, Any]:
    """The fields of request `args` (top level or extra_body) that reshape the distribution."""
    found: dict[str, Any] = {}
    for source in (args, args.get("extra_body") or {}):
        for key in (*NEUTRAL_OPENAI, *NEUTRAL_VLLM):
            if key in source and not _is_neutral(key, source[key]):
                found[key] = source[key]
        for key in REFUSED_WHEN_SET:
            if source.get(key):
                found[key] = source[key]
        for key in REFUSED_WHEN_PRESENT:
            if source.get(key) is not None:
                found[key] = source[key]
        for key, neutral in NEUTRAL_CHOICES.items():
            value = source.get(key)
            if key == "tool_choice" and isinstance(value, dict):  # a named tool is forced
                found[key] = value
            elif _choice(value) not in neutral:
                found[key] = value
    return found


def temperature_conflicts(args: dict[str, Any], temperature: float | None) -> dict[str, Any]:
    """The temperatures of request `args` (top level or extra_body) that differ from the one the
    trainer divides its logits by: `temperature` (the run's `sampling.temperature`), or where
    that is None, the request's own top-level one (extra_body's is merged over it, so vLLM
    would sample at extra_body's)."""
    expected = args.get("temperature") if temperature is None else temperature
    found: dict[str, Any] = {}
    if expected is None:
        return found
    for name, source in (
        ("temperature", args),
        ("extra_body.temperature", args.get("extra_body") or {}),
    ):
        value = source.get("temperature")
        if value is not None and float(value) != float(expected):
            found[name] = value
    return found


def check_reproducible(args: dict[str, Any], where: str, temperature: float | None = None) -> None:
    """Raise SamplingFilterError naming each field `where` asks for that the trainer cannot
    reproduce in its log-probabilities: a filter, penalty or constraint, or a temperature other
    than `temperature` (see `temperature_conflicts`)."""
    problems = []
    found = unreproducible(args)
    if found:
        problems.append(
            f"{where} asks for {_fields(found)}: the trainer's log-probabilities are the full "
            "temperature-scaled distribution, so a sampler that filters, penalises or "
            "constrains tokens (constrained decoding, forced tool calls) would bias every "
            "importance ratio. Remove these (use sampling.temperature to sharpen or flatten "
            "the distribution; ask for a format in the prompt and reward it instead)."
        )
    conflicts = temperature_conflicts(args, temperature)
    if conflicts:
        divisor = (
            f"sampling.temperature={temperature:g}"
            if temperature is not None
            else f"the request's temperature={args['temperature']}"
        )
        problems.append(
            f"{where} asks for {_fields(conflicts)} but the trainer divides its logits by "
            f"{divisor}: the server would sample from another distribution than the one every "
            f"importance ratio divides by. Remove {', '.join(conflicts)} and set "
            "sampling.temperature to the temperature you want."
        )
    if problems:
        raise SamplingFilterError(" ".join(problems))


def check_run_sampling(cfg: SamplingConfig) -> None:
    """`check_reproducible` for the run config's own sampling section."""
    run = {"top_p": cfg.top_p, "temperature": cfg.temperature, "extra_body": cfg.extra_body}
    check_reproducible(run, "sampling", cfg.temperature)


def _fields(found: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in found.items())


def check_logprobs_mode(mode: str | None, temperature: float) -> None:
    """Raise SamplingFilterError unless a server in logprobs mode `mode` (None: it does not
    say, trusted) returns what the importance ratio needs: log-probabilities of the
    distribution the tokens were drawn from. `raw_logprobs` (vLLM's default, what plain
    `vllm serve` runs) are taken before the temperature, so they are right only at 1; the
    `*_logits` modes return logits, never log-probabilities."""
    if mode in (None, "processed_logprobs") or (mode == "raw_logprobs" and temperature == 1.0):
        return
    raise SamplingFilterError(
        f"the server returns {mode} (its --logprobs-mode) but training at "
        f"sampling.temperature={temperature:g} needs the log-probabilities the tokens were "
        "sampled from: start it with vf-vllm (which sets it), or add "
        "`--logprobs-mode processed_logprobs` to its command line"
    )
