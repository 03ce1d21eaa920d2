"""The generate bridge: a local HTTP server between verifiers 0.4's `train` client and vf-vllm's
token-in route (`--enable-scale-out`). It forwards each call to an upstream, spells each
log-probability as renderers 0.1.12 reads it (`"token": "token_id:N"`), derives a seed per turn
(`derive_seed`), samples at the run's temperature, refuses (400) sampling the trainer cannot
reproduce, records every call (`BridgeCall`), and reports each rollout's calls, answers and
server failures (`CallReport`) so that the run's router weighs them as it weighs its own.
Design: docs/training.md#verifiers-04-environments.

Alone: `python -m rlvr.envserver.bridge --upstream http://127.0.0.1:8000/v1 --temperature 1`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import signal
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from rlvr.config.sampling import SamplingFilterError, check_reproducible
from rlvr.config.server import auth_header, server_root
from rlvr.rollouts.router import SERVER_STATE_STATUSES, Fault, UpstreamFailure

GENERATE_PATH = "/inference/v1/generate"
MODELS_PATH = "/v1/models"
FORWARDED_HEADERS = ("Authorization", "X-Session-ID")
ROLLOUT_HEADER = "X-Rlvr-Rollout"
"""The header a caller marks its rollout's calls with; the bridge's hooks receive its value."""
SEED_MODULUS = 2_147_483_647
"""Derived seeds stay below 2**31 - 1, the range of the classic path's seeds."""
MAX_BODY_BYTES = 256 << 20
"""aiohttp's default cap (1 MiB) is below a long prompt's ids or a multimodal payload."""
UPSTREAM_KEEPALIVE_S = 3.0
"""Below uvicorn's 5 s keep-alive, so no idle connection is reused as the server closes it."""


class RequestRefused(ValueError):
    """A generate request the bridge does not forward (answered with HTTP 400)."""


class UpstreamsDown(UpstreamFailure):
    """No upstream answered: none could be reached, or the one called timed out or dropped the
    call (answered with HTTP 502)."""


class CallReport(Protocol):
    """Who hears of the generate calls of each rollout (`mark`: its `ROLLOUT_HEADER`, None
    when the caller sent none): in a run, the rollout's router attempt."""

    def requested(self, mark: str | None) -> None: ...

    def answered(self, mark: str | None) -> None: ...

    def failed(self, mark: str | None, failure: UpstreamFailure) -> None: ...


@dataclass(frozen=True)
class BridgeCall:
    """One generate call through the bridge: what it sent vLLM and what vLLM returned."""

    model: str | None
    """The served name asked for: one name per weight version under adapter sync."""
    upstream: str
    seed: int | None
    """The per-turn seed sent (None: the request had none)."""
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str | None
    weight_versions: list[dict[str, Any]] | None = None
    """vLLM's spans of output tokens per weight version (`{"version", "start", "end"}`): the
    name a push gave `/finish_weight_update`, else "default"."""


def derive_seed(seed: int, prompt_ids: Sequence[int]) -> int:
    """The seed one turn samples with: a hash of the episode's `seed` and the turn's prompt ids.

    A later turn's prompt holds the earlier completions, so each turn gets its own seed (vLLM
    seeds a fresh generator per request: one seed on every turn would draw the same noise for
    each turn's j-th token), and the same episode seed and prompt give the same seed again.
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{seed}:".encode())
    digest.update(array("q", prompt_ids).tobytes())
    return int.from_bytes(digest.digest(), "little") % SEED_MODULUS


def prepare(body: dict[str, Any], temperature: float) -> dict[str, Any]:
    """The body to forward for generate request `body`: its seed derived per turn and the run's
    `temperature` where it names none. Raises RequestRefused for a request the bridge cannot
    serve or the trainer cannot reproduce."""
    params = body.get("sampling_params")
    prompt_ids = body.get("token_ids")
    if not isinstance(params, dict):
        raise RequestRefused("sampling_params must be a JSON object")
    if not isinstance(prompt_ids, list) or not all(type(t) is int for t in prompt_ids):
        raise RequestRefused("token_ids must be a list of integers")
    if body.get("stream"):
        raise RequestRefused("stream=true: the bridge answers whole responses only")
    if body.get("features") or body.get("content_parts"):
        raise RequestRefused("multimodal input: the trainer's samples carry token ids only")
    if params.get("seed") is not None and type(params["seed"]) is not int:
        raise RequestRefused(f"seed={params['seed']!r}: a seed is an integer")
    if params.get("n", 1) != 1:
        raise RequestRefused(f"n={params['n']!r}: the bridge serves one completion per call")
    try:
        check_reproducible(params, "the generate request's sampling_params", temperature)
    except SamplingFilterError as e:
        raise RequestRefused(str(e)) from None
    params = dict(params)
    if params.get("temperature") is None:
        params["temperature"] = temperature
    if params.get("seed") is not None:
        params["seed"] = derive_seed(params["seed"], prompt_ids)
    return {**body, "sampling_params": params}


def reshape_logprobs(data: dict[str, Any]) -> dict[str, Any]:
    """Give every log-probability entry of generate response `data` (top candidates included)
    the `"token": "token_id:N"` renderers reads, in place; return `data`."""
    for choice in data.get("choices") or []:
        for entry in (choice.get("logprobs") or {}).get("content") or []:
            for item in (entry, *(entry.get("top_logprobs") or [])):
                if "token_id" in item:
                    item.setdefault("token", f"token_id:{item['token_id']}")
    return data


def call_record(sent: dict[str, Any], data: dict[str, Any], upstream: str) -> BridgeCall:
    """The BridgeCall of request body `sent` (as forwarded) answered by `data` from `upstream`."""
    choice = (data.get("choices") or [{}])[0]
    content = (choice.get("logprobs") or {}).get("content") or []
    return BridgeCall(
        model=sent.get("model"),
        upstream=upstream,
        seed=sent["sampling_params"].get("seed"),
        prompt_ids=list(sent["token_ids"]),
        completion_ids=list(choice.get("token_ids") or []),
        completion_logprobs=[entry.get("logprob") for entry in content],
        finish_reason=choice.get("finish_reason"),
        weight_versions=choice.get("weight_versions"),
    )


def error_response(status: int, message: str) -> web.Response:
    """An error in vLLM's (OpenAI's) shape, whose message the OpenAI client reports."""
    error = {"message": message, "type": "BadRequestError" if status == 400 else "BadGateway"}
    return web.json_response({"error": {**error, "code": status}}, status=status)


class Bridge:
    """The generate bridge (see the module docstring) on `host`:`port` (0: a free port) in front
    of vf-vllm `upstreams` (base URLs, ".../v1" or the root), for a run sampling at
    `temperature`. Serves from its own event loop in a background thread; a context manager, or
    start()/stop(). Keeps the last `keep_calls` BridgeCalls (None: all)."""

    def __init__(
        self,
        upstreams: Sequence[str],
        temperature: float,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_s: float | None = None,
        api_key: str | None = None,
        keep_calls: int | None = 4096,
        report: CallReport | None = None,
    ):
        if not upstreams:
            raise ValueError("the bridge needs at least one upstream")
        self.upstreams = [server_root(u) for u in upstreams]
        self.temperature = temperature
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._auth = auth_header(api_key)
        """The upstreams' key (`server.api_key`), sent instead of whatever 0.4's client sends
        (its own placeholder): a vf-vllm started with --api-key answers 401 to anything else."""
        self.keep_calls = keep_calls
        self.report = report
        """Hears each generate call forwarded, its answer, and its server failure: none
        reached or answered in `timeout_s` (a 502 to the caller), or a 5xx or 401/403/404
        (passed on to the caller as it came)."""
        self._calls: list[BridgeCall] = []
        self._dropped = 0
        self._lock = threading.Lock()
        self._in_flight = dict.fromkeys(self.upstreams, 0)
        self._picks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What 0.4's client is given as its base URL (renderers strips the /v1 for generate)."""
        return f"{self.root_url}/v1"

    @property
    def calls(self) -> list[BridgeCall]:
        """The calls kept so far, oldest first."""
        with self._lock:
            return list(self._calls)

    def calls_since(self, index: int) -> list[BridgeCall]:
        """The calls from the `index`-th (counting every call since start, from 0) on. Raises
        LookupError when some of them are no longer kept."""
        with self._lock:
            if index < self._dropped:
                raise LookupError(
                    f"calls before #{self._dropped} are no longer kept "
                    f"(keep_calls={self.keep_calls}); asked from #{index}"
                )
            return self._calls[index - self._dropped :]

    def start(self) -> str:
        """Serve in a background thread; return `base_url`."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="generate-bridge", daemon=True
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def stop(self) -> None:
        """Stop serving and end the thread; a no-op when not started."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> Bridge:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_KEEPALIVE_S)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        )
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(GENERATE_PATH, self._generate)
        app.router.add_get(MODELS_PATH, self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestRefused("the body must be a JSON object")
            sent = prepare(body, self.temperature)
        except ValueError as e:  # RequestRefused, or a body that is not JSON
            return error_response(400, str(e))
        mark = request.headers.get(ROLLOUT_HEADER)
        if self.report is not None:
            self.report.requested(mark)
        try:
            upstream, reply = await self._forward("POST", GENERATE_PATH, request, sent)
        except UpstreamsDown as e:
            if self.report is not None:
                self.report.failed(mark, e)
            return error_response(502, str(e))
        if reply.status != 200:
            if self.report is not None and (
                reply.status >= 500 or reply.status in SERVER_STATE_STATUSES
            ):
                said = f"{upstream} answered {reply.status}: {reply.text[:300]}"
                self.report.failed(mark, UpstreamFailure(said, Fault.SUSPECT))
            return reply
        if self.report is not None:
            self.report.answered(mark)
        data = json.loads(reply.body)
        self._record(call_record(sent, data, upstream))
        return web.json_response(reshape_logprobs(data))

    async def _models(self, request: web.Request) -> web.Response:
        try:
            return (await self._forward("GET", MODELS_PATH, request))[1]
        except UpstreamsDown as e:
            return error_response(502, str(e))

    async def _forward(
        self, method: str, path: str, request: web.Request, body: dict[str, Any] | None = None
    ) -> tuple[str, web.Response]:
        """Send the call to the least busy upstream, the next one where it cannot be reached
        (nothing was sent then); return the upstream and its answer as it came."""
        assert self._session is not None
        headers = {k: request.headers[k] for k in FORWARDED_HEADERS if k in request.headers}
        headers.update(self._auth)
        failures = []
        for upstream in self._by_load():
            self._in_flight[upstream] += 1
            try:
                async with self._session.request(
                    method, upstream + path, json=body, headers=headers
                ) as r:
                    content_type = r.headers.get("Content-Type", "application/json")
                    reply = web.Response(
                        status=r.status, body=await r.read(), headers={"Content-Type": content_type}
                    )
                    return upstream, reply
            except aiohttp.ClientConnectorError as e:
                failures.append(f"{upstream}: {e}")
            except TimeoutError as e:  # a hung server, or a request too long for the deadline
                why = f"{upstream}{path} did not answer within {self.timeout_s} s"
                raise UpstreamsDown(why, Fault.SUSPECT) from e
            except aiohttp.ClientError as e:  # dropped mid-call
                raise UpstreamsDown(f"{upstream}{path} failed: {e!r}", Fault.GONE) from e
            finally:
                self._in_flight[upstream] -= 1
        why = "no upstream could be reached: " + "; ".join(failures)
        raise UpstreamsDown(why, Fault.GONE)

    def _by_load(self) -> list[str]:
        """The upstreams, fewest calls in flight first; ties rotate from call to call."""
        self._picks += 1
        shift = self._picks % len(self.upstreams)
        rotated = self.upstreams[shift:] + self.upstreams[:shift]
        return sorted(rotated, key=self._in_flight.__getitem__)

    def _record(self, call: BridgeCall) -> None:
        with self._lock:
            self._calls.append(call)
            excess = 0 if self.keep_calls is None else len(self._calls) - self.keep_calls
            if excess > 0:
                del self._calls[:excess]
                self._dropped += excess


def main(argv: list[str] | None = None) -> None:
    """Run the bridge alone until SIGINT or SIGTERM, printing its base URL first."""
    parser = argparse.ArgumentParser(
        prog="python -m rlvr.envserver.bridge",
        description="verifiers 0.4's generate calls to vf-vllm (started with --enable-scale-out)",
    )
    parser.add_argument(
        "--upstream", action="append", required=True, help="a vf-vllm base URL (repeatable)"
    )
    parser.add_argument("--temperature", type=float, required=True, help="the run's temperature")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--keep-calls", type=int, default=0, help="calls kept in memory")
    parser.add_argument("--api-key", default=None, help="the upstreams' key (vf-vllm --api-key)")
    args = parser.parse_args(argv)
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    bridge = Bridge(
        args.upstream,
        args.temperature,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        keep_calls=args.keep_calls,
    )
    with bridge:
        print(bridge.base_url, flush=True)
        done.wait()


if __name__ == "__main__":
    main()
