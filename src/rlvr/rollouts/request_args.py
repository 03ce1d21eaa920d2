"""The sampling arguments of every training request, and the rule that keeps the sampler's
distribution the one the trainer computes.

The importance ratio compares the trainer's log-probability of each sampled token with the
sampler's. The trainer's is the temperature-scaled softmax of its logits. vLLM's
(`processed_logprobs`) are taken after everything that reshapes the distribution: top-k,
top-p, min-p, repetition/presence/frequency penalties, logit bias, min_tokens, allowed or
banned tokens. Any of those at a non-neutral value makes the two distributions differ, which
biases every ratio and looks like a failed weight push. So a run that asks for one is refused
at start, and every request states the neutral values explicitly: vLLM would otherwise fill
unset fields from the model's `generation_config.json` (vf-vllm also starts vLLM with
`--generation-config vllm`, for servers started by hand this is the second guard).

The temperature is the trainer's too: it divides its logits by `sampling.temperature`, so a
temperature anywhere else (`sampling.extra_body`, which the OpenAI client merges over the
request's own fields, or an environment's `sampling_args` and their `extra_body`) is refused
unless it is the same value. Beam search, watermarking and a thinking-token budget replace or
bias the draw itself and are refused like the filters.

Constrained decoding is refused for the same reason: a JSON schema, a regex, a grammar, a choice
list or a forced tool call (`response_format`, `structured_outputs`, `guided_*`, `tool_choice`
of "required" or a named tool) masks tokens before vLLM computes its log-probabilities, and the
trainer cannot replay the constraint's state at every position.

Seeds: each request's seed is derived from (run seed, step, dataset position, rollout, turn).
Distinct per turn, because vLLM seeds a fresh generator per request: one seed on every turn of
a multi-turn rollout would draw the same noise for the j-th token of each turn, correlating the
turns. Reproducible, so a resumed run samples exactly what the interrupted one would have.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlvr.config import SamplingConfig

# Sampling fields that make vLLM return what training needs: token ids of prompt and
# completion, and the sampler's log-probability of every generated token.
TOKEN_SAMPLING_ARGS: dict[str, Any] = {"logprobs": True, "extra_body": {"return_token_ids": True}}

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


# Reply budget of a run whose config and environment both leave max_tokens unset.
FALLBACK_MAX_TOKENS = 512


def max_tokens(cfg: SamplingConfig, env_defaults: dict[str, Any]) -> int:
    """The run config's `sampling.max_tokens` when it sets one, else the environment's default
    (a length that fits its task), else FALLBACK_MAX_TOKENS."""
    if cfg.max_tokens is not None:
        return cfg.max_tokens
    return env_defaults.get("max_tokens") or FALLBACK_MAX_TOKENS


def build_sampling_args(
    cfg: SamplingConfig, env_defaults: dict[str, Any] | None = None, seed: int | None = None
) -> dict[str, Any]:
    """The environment's own sampling defaults, then ours, then the neutral filters and the
    token-return fields (those must win: training cannot run without them). `extra_body` is
    merged key by key; `max_tokens` comes from `max_tokens()`. Raises SamplingFilterError for a
    filter the trainer cannot reproduce."""
    env_defaults = env_defaults or {}
    check_reproducible(env_defaults, "the environment's sampling_args", cfg.temperature)
    check_run_sampling(cfg)
    args: dict[str, Any] = {k: v for k, v in env_defaults.items() if k != "extra_body"}
    args.update(
        temperature=cfg.temperature, max_tokens=max_tokens(cfg, env_defaults), **NEUTRAL_OPENAI
    )
    args.pop("n", None)
    if seed is not None:
        args["seed"] = seed
    args["logprobs"] = True
    args["extra_body"] = {
        **env_defaults.get("extra_body", {}),
        **cfg.extra_body,
        **NEUTRAL_VLLM,
        **TOKEN_SAMPLING_ARGS["extra_body"],
    }
    return args


def request_seed(seed: int, step: int, position: int, rollout: int) -> int:
    """A per-rollout sampling seed: distinct across rollouts of a group (else they would be
    identical), identical across reruns of the same step (so a resumed run samples the same).
    Each turn of the rollout then sends `turn_seed` of it."""
    return _mix(seed, step, position, rollout)


def turn_seed(rollout_seed: int, turn: int) -> int:
    """The seed of turn `turn` (0-based) of a rollout: the rollout's own seed on the first turn,
    a distinct one derived from it on every later turn (see the module docstring)."""
    return rollout_seed if turn == 0 else _mix(rollout_seed, turn)


def _mix(value: int, *parts: int) -> int:
    for part in parts:
        value = (value * 1_000_003 + part + 1) % 2_147_483_647
    return value
