"""Deciding how the trainer's weights reach each vf-vllm of the run, and connecting every rank.

`connect` runs once at start-up on every rank: rank 0 checks that each server can serve this
policy (vocabulary, logprobs, alike across servers), chooses the push (`choose_push`: adapter
or merged) and tells the other ranks. The trainer gets one `FleetPush` and never asks which.
Design: docs/weight-transfer.md#choosing-the-push.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlvr.config import Config, ConfigError
from rlvr.config.sampling import SamplingFilterError, check_logprobs_mode
from rlvr.model.quantization import quantization_of
from rlvr.model.rope import check_served_rope
from rlvr.rollouts.mixture import leaves
from rlvr.rollouts.servers import Server, ServerPool
from rlvr.weight_sync.base import WeightPush
from rlvr.weight_sync.control import ServerControl, ServerError, server_answers
from rlvr.weight_sync.fleet import FleetPush, NotConnected
from rlvr.weight_sync.probe import PROBE_TEXT, ModelProbe, probe_ids

if TYPE_CHECKING:  # imports vLLM: loaded when a trainer connects
    from rlvr.weight_sync.merged import MergedPush


@dataclass
class Connection:
    """What the trainer keeps of its servers: `weights` pushes every version to all of them,
    `pool` is their state (shared with the rollout router), `probe` checks that a server's
    model is the trainer's (None: `server.push_probe=false`)."""

    weights: FleetPush
    pool: ServerPool
    probe: ModelProbe | None


def connect(
    cfg: Config,
    accelerator: Any,
    model: Any,
    *,
    tokenizer: Any,
    reasoning_vocab: Any,
    compute_dtype: Any,
    env: Any,
    start_step: int,
    say: Callable[[str], None],
) -> Connection:
    """Rank 0 waits for the servers, checks those that answer and picks how weights reach
    each; all ranks then connect to them together. A server down at start is out of rotation
    and joins, checked the same way, when it answers at a push (`connect_one`). `model` is the
    (wrapped) policy, `say` prints on the main process."""
    server, rank = cfg.server, accelerator.process_index
    unwrapped = accelerator.unwrap_model(model)
    agree = agreement(accelerator)
    urls = agree(dict(enumerate(server.urls)) if accelerator.is_main_process else None)
    ways = None
    if accelerator.is_main_process:
        up = wait_for_servers(cfg, say, urls=list(urls.values()))
        ways = {i: plan_server(cfg, urls[i], unwrapped, env, reasoning_vocab, say) for i in up}
        check_same_push(ways, urls)
        if len(up) > 1:
            check_same_serving(cfg, {i: urls[i] for i in up})
    ways = agree(ways)
    first = min(ways)

    def plan_joiner(joiner: Server) -> ServerWay | str:
        """Rank 0: the way weights reach `joiner`, answering for the first time, checked
        against the first server's; or why it cannot join."""
        pair = {first: urls[first], joiner.index: joiner.url}
        try:
            way = plan_server(cfg, joiner.url, unwrapped, env, reasoning_vocab, say)
            check_same_push({first: ways[first], joiner.index: way}, pair)
            check_same_serving(cfg, pair)
        except (ConfigError, ServerError) as e:
            return str(e)
        return way

    def connect_one(server: Server) -> WeightPush:
        if server.index not in ways:  # down at start or listed anew: rank 0's plan for all
            way = agree(plan_joiner(server) if accelerator.is_main_process else None)
            if isinstance(way, str):
                raise ServerError(way)
            ways[server.index] = way
        way = ways[server.index]
        return connect_server(cfg, server.url, way, rank, unwrapped, compute_dtype, say)

    pool = ServerPool(list(urls.values()))
    pushes = [connect_one(s) if s.index in ways else NotConnected() for s in pool.servers]
    way = ways[first].way
    if way == "adapter":
        requested = f"{pushes[first].name(start_step)!r}, one name per weight version"
    else:
        requested = repr(cfg.served_model)
    where = f" to each of {len(urls)} servers" if len(urls) > 1 else ""
    say(f"weight push: {way}{where}; rollouts request model {requested}")
    for i in sorted(set(urls) - set(ways)):
        pool.mark_down(pool.servers[i], "did not answer at start: joins when it answers")
    weights = FleetPush(pool, pushes, connect_one, agree, rank, server.api_key, server.fleet_file)
    probe = None
    if server.push_probe:
        probe = ModelProbe(probe_ids(tokenizer, reasoning_vocab), server.probe_kl_max)
    return Connection(weights, pool, probe)


STILL_WAITING_S = 30.0
"""How often `wait_for_servers` says it is still waiting."""
START_GRACE_S = 30.0
"""How long, once one server answers, start-up waits for the others (at most
`server.start_wait_s`): servers started together join at once, not a step later."""


def wait_for_servers(
    cfg: Config, say: Callable[[str], None], poll_s: float = 1.0, urls: list[str] | None = None
) -> list[int]:
    """Rank 0: the indices of the servers (`urls`, default `server.urls`, read once: a fleet
    file may change meanwhile) that answer their health check. Waits up to
    `server.start_wait_s` for one (a trainer started beside servers still loading), then up
    to `START_GRACE_S` more for the rest (the others join when they answer); a ConfigError
    naming the servers and how to start one when none answers."""
    server = cfg.server
    urls = urls or server.urls
    deadline = time.monotonic() + server.start_wait_s
    up: list[int] = []
    waiting, told, first_up = list(range(len(urls))), -math.inf, math.inf
    while True:
        up += [i for i in waiting if server_answers(urls[i], server.api_key)]
        waiting = [i for i in waiting if i not in up]
        now = time.monotonic()
        first_up = min(first_up, now) if up else first_up
        names = ", ".join(urls[i] for i in waiting)
        if not waiting:
            return sorted(up)
        if now >= min(deadline, first_up + START_GRACE_S) and up:
            say(f"starting without {names}: not answering yet; joins at a push once it answers")
            return sorted(up)
        if now >= deadline:
            raise ConfigError(
                f"no vf-vllm answers at {names} (waited {server.start_wait_s:g} s, "
                f"server.start_wait_s): start it first, e.g. `vf-vllm --model {cfg.model.name} "
                "--port 8000`, or point server.base_url (base_urls) at a running one"
            )
        if now - told >= STILL_WAITING_S:
            say(f"waiting for vf-vllm at {names} to answer (up to {deadline - now:.0f} s more)")
            told = now
        time.sleep(min(poll_s, max(deadline - now, 0.0)))


@dataclass
class ServerWay:
    """How weights reach one server: `way` (`adapter` or a merged transfer) and, for a QLoRA
    policy under adapter sync, the merged transfer its dequantized base travels by first."""

    way: str
    base_transfer: str | None = None


def plan_server(
    cfg: Config, url: str, model: Any, env: Any, reasoning_vocab: Any, say: Callable[[str], None]
) -> ServerWay:
    """Rank 0: check that the server at `url` can serve this policy and choose how weights
    reach it."""
    merged = merged_push(cfg, url, 0)
    try:
        check_served_rope(model.config, cfg.model.name, merged.control, url)
        check_served_vocabulary(merged.control, reasoning_vocab, cfg, url)
        check_served_logprobs(merged.control, cfg, url)
        way = choose_push(merged, cfg, model, env, say)
        base = merged.resolve() if way == "adapter" and quantization_of(model) != "none" else None
    finally:
        merged.control.close()
    return ServerWay(way, base)


def check_same_push(ways: dict[int, ServerWay], urls: Mapping[int, str]) -> None:
    """Every server (`ways` by index) takes the weights the same way (the adapter, or merged
    weights): a version's served name must mean the same weights on each."""
    (first, *others) = sorted(ways)
    adapter = {i: w.way == "adapter" for i, w in ways.items()}
    odd = [i for i in others if adapter[i] != adapter[first]]
    if not odd:
        return
    i = odd[0]
    raise ConfigError(
        f"server {i} ({urls[i]}) {'can' if adapter[i] else 'cannot'} load LoRA adapters at run "
        f"time but server {first} ({urls[first]}) {'can' if adapter[first] else 'cannot'}: "
        "start every server of server.base_urls with the same LoRA flags (vf-vllm "
        "--enable-lora), or set server.lora_sync=merged"
    )


def check_same_serving(cfg: Config, urls: Mapping[int, str]) -> None:
    """Rank 0: the servers `urls` (by index) serve `cfg.served_model` with the same tokenizer
    (the ids of a fixed text), context length and logprobs mode; ConfigError naming the server
    and the field that differs from the first's."""
    prints = {i: serving_fingerprint(cfg, i, url) for i, url in urls.items()}
    first, *others = sorted(urls)
    for i in others:
        for field_name, value in prints[i].items():
            if value != prints[first][field_name]:
                raise ConfigError(
                    f"server {i} ({urls[i]}) serves {field_name}={_short(value)} but server "
                    f"{first} ({urls[first]}) serves {_short(prints[first][field_name])}: every "
                    "server of server.base_urls must serve the same model and tokenizer"
                )


def serving_fingerprint(cfg: Config, index: int, url: str) -> dict[str, Any]:
    """What must be equal across servers, as server `index` at `url` reports it."""
    control = ServerControl(url, api_key=cfg.server.api_key, timeout_s=cfg.server.timeout_s)
    try:
        cards = {c.get("id"): c for c in control.get("/v1/models").get("data", [])}
        card = cards.get(cfg.served_model)
        if card is None:
            raise ConfigError(
                f"server {index} ({url}) does not serve model {cfg.served_model!r} (it serves "
                f"{sorted(cards)}): set server.served_model, or serve the same model on every "
                "server of server.base_urls"
            )
        ids = control.post("/tokenize", json={"model": cfg.served_model, "prompt": PROBE_TEXT})
        return {
            "max_model_len": card.get("max_model_len"),
            "logprobs_mode": control.logprobs_mode(),
            "tokenizer_mode": control.tokenizer_mode(),
            "vocabulary (ids of the probe text)": ids.get("tokens"),
        }
    finally:
        control.close()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def connect_server(
    cfg: Config,
    url: str,
    way: ServerWay,
    rank: int,
    model: Any,
    compute_dtype: Any,
    say: Callable[[str], None],
) -> WeightPush:
    """This rank's push into the server at `url`, connected (every rank calls it together;
    for a QLoRA policy under adapter sync, its dequantized base is pushed first)."""
    from rlvr.weight_sync.adapter import AdapterPush
    from rlvr.weight_sync.merged_stream import MergedWeightSource

    merged = merged_push(cfg, url, rank)
    if way.base_transfer is not None:
        push_trained_base(merged, model, compute_dtype, way.base_transfer, 0)
        say(
            f"pushed the dequantized {quantization_of(model)} base ({way.base_transfer}) to "
            f"{url}: the server's base model now computes what the trainer's base computes"
        )
    if way.way == "adapter":
        weights = AdapterPush(
            merged.control, url, cfg.server.adapter_name, rank, exact_check=cfg.server.exact_check
        )
        weights.connect(model)
        return weights
    merged.connect(MergedWeightSource(model, dtype=compute_dtype), way.way)
    return merged


def agreement(accelerator: Any) -> Callable[[Any], Any]:
    """`agree(x)`: rank 0's `x` on every rank (the identity with one rank)."""
    if accelerator.num_processes == 1:
        return lambda x: x
    from accelerate.utils import broadcast_object_list

    return lambda x: broadcast_object_list([x])[0]


def push_trained_base(
    merged: MergedPush, model: Any, dtype: Any, backend: str, version: int
) -> None:
    """Replace the server's base weights by the base `model` computes with (its quantized
    layers dequantized, no adapter), through the merged transfer `backend`; every rank calls
    it. Without this a QLoRA run's adapters would be served on the unquantized original: the
    sampler would sample from another model than the trainer scores (ratio and model probe
    off by the quantization error, see docs/training.md#quantized-bases-qlora)."""
    from rlvr.weight_sync.merged_stream import MergedWeightSource

    merged.connect(MergedWeightSource(model, dtype=dtype, with_adapters=False), backend)
    merged.push(version)
    merged.disconnect()


def merged_push(cfg: Config, url: str, rank: int) -> MergedPush:
    """The merged-weight push into the server at `url` that `cfg.server` describes, not yet
    connected (it holds the server's `control`, which start-up asks first, whichever way the
    weights then travel)."""
    from rlvr.weight_sync.merged import MergedPush

    server = cfg.server
    return MergedPush(
        url,
        cfg.served_model,
        backend=server.backend,
        api_key=server.api_key,
        timeout_s=server.timeout_s,
        transfer_timeout_s=server.transfer_timeout_s,
        transfer_host=server.transfer_host,
        transfer_port=server.transfer_port,
        rank=rank,
        exact_check=server.exact_check,
    )


def check_served_vocabulary(
    control: Any, reasoning_vocab: Any, cfg: Config, url: str | None = None
) -> None:
    """The server must sample from the policy's vocabulary: a reasoning vocabulary needs
    vf-vllm serving the expanded directory (with its gate and folding tokenizer), and a
    server with one needs a policy that has it. A server that does not say is trusted."""
    from rlvr.server.plugin import REASONING_VOCAB_TOKENIZER_MODE

    url = url or cfg.server.urls[0]
    mode = control.tokenizer_mode()
    if mode is None:
        return
    vocab, name = reasoning_vocab, cfg.model.name
    if vocab is not None and mode != REASONING_VOCAB_TOKENIZER_MODE:
        raise ConfigError(
            f"model {name} has a reasoning vocabulary ({vocab.size} ids) but the server at "
            f"{url} serves a model without one (tokenizer mode {mode!r}): "
            "write the expanded model with scripts/expand_vocab.py, serve that directory "
            "(vf-vllm switches its gate on) and set model.name to it"
        )
    if vocab is None and mode == REASONING_VOCAB_TOKENIZER_MODE:
        raise ConfigError(
            f"the server at {url} serves a model with a reasoning "
            f"vocabulary but model {name} has none: train the directory it serves"
        )


def check_served_logprobs(control: Any, cfg: Config, url: str | None = None) -> None:
    """The server's logprobs must be the sampled distribution's (see
    `check_logprobs_mode`): otherwise every importance ratio is off, silently."""
    url = url or cfg.server.urls[0]
    try:
        check_logprobs_mode(control.logprobs_mode(), cfg.sampling.temperature)
    except SamplingFilterError as e:
        raise ConfigError(f"server {url}: {e}") from None


def choose_push(merged: Any, cfg: Config, model: Any, env: Any, say: Callable[[str], None]) -> str:
    """`adapter` (push the LoRA adapter, served by vLLM on its frozen base) or the
    transfer of merged weights. `server.lora_sync=auto` takes the adapter whenever the
    server can serve it; otherwise says why in the log and pushes merged weights. `model`
    is the unwrapped policy."""
    mode = cfg.server.lora_sync
    if not cfg.lora.enabled:
        if mode == "adapter":
            raise ConfigError("server.lora_sync=adapter needs lora.enabled=true")
        return check_frozen_helpers(merged.resolve(), env, cfg)
    if mode == "merged":
        return check_frozen_helpers(merged.resolve(), env, cfg)
    from rlvr.weight_sync.adapter import adapter_sync_problem

    problem = adapter_sync_problem(model, merged.control.max_lora_rank())
    if problem is None:
        return "adapter"
    if mode == "adapter":
        raise ConfigError(f"server.lora_sync=adapter: {problem}")
    say(f"pushing merged weights, not the adapter: {problem}")
    return check_frozen_helpers(merged.resolve(), env, cfg)


def check_frozen_helpers(push: str, env: Any, cfg: Config) -> str:
    """Refuse merged pushes into a server whose base model the environment uses as a
    frozen helper (vf_planner's worker without worker_base_url): the helper would train
    along with the policy."""
    frozen = [n for n, e in leaves(env).items() if getattr(e, "frozen_model_on_policy_server", 0)]
    if frozen:
        name = frozen[0] or cfg.env_label
        raise ConfigError(
            f"environment {name} uses the policy's server as a frozen model "
            "(e.g. vf_planner's worker), but this run pushes merged weights into it, so "
            "that model would train too. Use LoRA adapter sync (lora.enabled=true, "
            "server.lora_sync=auto or adapter, vf-vllm --enable-lora) or give the "
            "environment its own server with worker_base_url in env.args."
        )
    return push
