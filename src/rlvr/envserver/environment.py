"""`EnvServerEnv`: a verifiers 0.4 taskset, run by its own EnvServer, as one environment of
this trainer (a classic verifiers `Environment`, so the worker, mixtures and evaluation take
it as they take any other).

Each rollout is one `run` request: the row's task data, our generate bridge in front of the
server the router chose (prompt ids in, token ids and log-probabilities out), the version's
served name and the rollout's sampling arguments with its own seed. The episode comes back as a
state that `rlvr.rollouts.to_samples` reads (`rlvr.envserver.episode`). Design and limits:
docs/training.md#verifiers-04-environments.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import verifiers as vf
from datasets import Dataset

from rlvr.config.env_server import EnvServerConfig
from rlvr.config.server import auth_header, server_root
from rlvr.envserver.bridge import GENERATE_PATH, ROLLOUT_HEADER, Bridge
from rlvr.envserver.episode import episode_state
from rlvr.envserver.launcher import EnvServerProcess, EnvServerSpec
from rlvr.envserver.liveness import Liveness
from rlvr.envserver.rows import export_rows, read_rows
from rlvr.envserver.side_venv import ensure_side_venv
from rlvr.envserver.wire import EnvServerClient, EpisodeDeadline, UnknownServerError
from rlvr.model.names import resolve_model
from rlvr.rollouts.router import Attempt, UpstreamFailure
from rlvr.rollouts.to_samples import MissingTokensError

API_KEY_VAR = "RLVR_ENVSERVER_API_KEY"
"""The variable the EnvServer reads the bridge's API key from (the bridge needs none)."""
SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "seed")
"""The sampling arguments a run request carries; the rest are the neutral filters and
token-return fields, which the train client and the bridge set themselves."""


def task_row(data: dict, index: int) -> dict:
    """A dataset row for one task: its data as JSON in `info`, a prompt to show and filter on
    (its `prompt` or `question` field, else the data itself as text)."""
    text = data.get("prompt") or data.get("question") or json.dumps(data)
    prompt = text if isinstance(text, list) else [{"role": "user", "content": str(text)}]
    return {
        "prompt": prompt,
        "answer": str(data.get("answer") or ""),
        "info": {"task_data": json.dumps(data)},
        "example_id": index,
    }


def task_dataset(rows: list[dict]) -> Dataset:
    return Dataset.from_list([task_row(row, i) for i, row in enumerate(rows)])


def run_request(
    row: dict, base_url: str, tokenizer: str, model: str, args: dict, mark: str
) -> dict:
    """The `run` request of one rollout of `row` (RunRequest in verifiers 0.4's serve types),
    its model calls marked `mark` for the bridge."""
    sampling = {key: args[key] for key in SAMPLING_KEYS if args.get(key) is not None}
    return {
        "task_data": json.loads(row["info"]["task_data"]),
        "client": {
            "type": "train",
            "base_url": base_url,
            "api_key_var": API_KEY_VAR,
            "renderer_model_name": tokenizer,
            "headers": {ROLLOUT_HEADER: mark},
        },
        "model": model,
        "sampling": sampling,
    }


def check_generate_route(upstream: str, api_key: str | None) -> None:
    """Raise MissingTokensError (which stops the run) unless `upstream` serves the token-in
    generate route 0.4's train client calls (vLLM serves it only with --enable-scale-out) to
    a caller with `api_key`."""
    url = server_root(upstream) + GENERATE_PATH
    reply = httpx.post(url, json={}, headers=auth_header(api_key), timeout=30)
    if reply.status_code == 401:
        raise MissingTokensError(
            f"{url} answered 401 ({reply.text[:200]}): the server was started with --api-key; "
            "set server.api_key to that key"
        )
    if reply.status_code in (403, 404):
        raise MissingTokensError(
            f"{url} answered {reply.status_code} ({reply.text[:200]}): a verifiers 0.4 "
            "environment needs it; serve with vf-vllm (it serves the route unless given "
            "--no-enable-scale-out), or start vllm serve with --enable-scale-out"
        )


def upstream_of(client: Any) -> str:
    """The vf-vllm base URL a rollout client talks to."""
    return str(client.client.base_url).rstrip("/")


def api_key_of(client: Any) -> str | None:
    """The key a rollout client sends its vf-vllm (`server.api_key`), for the bridge to send."""
    return getattr(client.client, "api_key", None)


def timeout_of(client: Any) -> float | None:
    """A rollout client's deadline for one call (`server.timeout_s`), for the bridge's."""
    timeout = getattr(client.client, "timeout", None)
    if isinstance(timeout, httpx.Timeout):
        timeout = timeout.read
    return float(timeout) if isinstance(timeout, int | float) else None


class RolloutAttempts:
    """The router attempt of each rollout in flight, by its mark (`ROLLOUT_HEADER`): the
    bridges' `CallReport`. A bridge serves from a thread of its own, so each report reaches
    its attempt on the attempt's event loop."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[asyncio.AbstractEventLoop, Attempt]] = {}

    @contextlib.contextmanager
    def running(self, mark: str, attempt: Attempt | None) -> Iterator[None]:
        """Reports of rollout `mark` reach `attempt` (None: an evaluation, nobody hears)."""
        if attempt is not None:
            self._running[mark] = (asyncio.get_running_loop(), attempt)
        try:
            yield
        finally:
            self._running.pop(mark, None)

    def requested(self, mark: str | None) -> None:
        self._on_loop(mark, lambda attempt: attempt.requested())

    def answered(self, mark: str | None) -> None:
        self._on_loop(mark, lambda attempt: attempt.answered())

    def failed(self, mark: str | None, failure: UpstreamFailure) -> None:
        self._on_loop(mark, lambda attempt: attempt.failed(failure))

    def _on_loop(self, mark: str | None, call: Callable[[Attempt], None]) -> None:
        loop, attempt = self._running.get(mark or "", (None, None))
        if attempt is not None:
            loop.call_soon_threadsafe(call, attempt)


class EnvServerEnv(vf.Environment):
    """A 0.4 taskset behind its EnvServer: `start` it, roll out through it, `close` it."""

    scores_own_rollouts = True
    """The taskset scored each episode on the server; nothing is scored again here."""

    def __init__(
        self,
        cfg: EnvServerConfig,
        rows: list[dict],
        eval_rows: list[dict],
        tokenizer: str,
        temperature: float,
        log_dir: Path,
    ):
        super().__init__(
            dataset=task_dataset(rows),
            eval_dataset=task_dataset(eval_rows),
            env_id=f"envserver:{cfg.taskset}",
            score_rollouts=False,
        )
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.temperature = temperature
        spec = EnvServerSpec(
            cfg.taskset, {"taskset": cfg.taskset_args}, cfg.workers, cfg.max_concurrent
        )
        self.server = EnvServerProcess(
            spec,
            venv=cfg.venv,
            log_path=log_dir / "envserver.log",
            startup_timeout_s=cfg.startup_timeout_s,
        )
        self.liveness = Liveness(self.server, cfg.taskset)
        self.bridges: dict[str, Bridge] = {}
        self.attempts = RolloutAttempts()
        self.clients: dict[asyncio.AbstractEventLoop, EnvServerClient] = {}
        self.deadlines = 0
        """Episodes cancelled at their deadline."""

    def start(self) -> EnvServerEnv:
        self.server.start()
        return self

    def _client(self) -> EnvServerClient:
        """This event loop's connection to the server (a zmq.asyncio socket serves one loop);
        a connection whose loop has closed, or to a server since restarted elsewhere, is
        closed too."""
        loop = asyncio.get_running_loop()
        for other in [o for o in self.clients if o.is_closed()]:
            self.clients.pop(other).close()
        if loop in self.clients and self.clients[loop].address != self.server.address:
            self.clients.pop(loop).close()
        if loop not in self.clients:
            self.clients[loop] = EnvServerClient(self.server.address)
        return self.clients[loop]

    def _bridge(self, client: Any) -> str:
        """The base URL of the bridge in front of the vf-vllm `client` talks to (with the
        client's key and deadline), started on first use."""
        upstream = upstream_of(client)
        if upstream not in self.bridges:
            check_generate_route(upstream, api_key_of(client))
            self.bridges[upstream] = Bridge(
                [upstream],
                temperature=self.temperature,
                timeout_s=timeout_of(client),
                api_key=api_key_of(client),
                report=self.attempts,
            )
            self.bridges[upstream].start()
        return self.bridges[upstream].base_url

    async def rollout(
        self, input: dict, client: Any, model: str, sampling_args: dict | None = None, **_: Any
    ) -> dict:
        mark = uuid.uuid4().hex
        url = self._bridge(client)
        request = run_request(input, url, self.tokenizer, model, sampling_args or {}, mark)
        try:
            with self.attempts.running(mark, getattr(client, "attempt", None)):
                deadline = self.cfg.episode_timeout_s
                episode = await self.liveness.run(lambda: self._client().run(request, deadline))
        except EpisodeDeadline as e:
            self.deadlines += 1
            return {"example_id": input.get("example_id", 0), "error": str(e)}
        except UnknownServerError as e:  # no episode of this server can train: stop the run
            raise MissingTokensError(str(e)) from e
        return episode_state(episode, input)

    def close(self) -> None:
        """Stop the bridges and the server's whole process group."""
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        for bridge in self.bridges.values():
            bridge.stop()
        self.bridges.clear()
        self.server.stop()


def exported_rows(cfg: EnvServerConfig, out_dir: Path) -> list[dict]:
    """The taskset's own rows, exported once per taskset and arguments into `out_dir` (a resumed
    run reads the same file)."""
    key = hashlib.sha256(json.dumps([cfg.taskset, cfg.taskset_args], sort_keys=True).encode())
    path = out_dir / f"tasks-{key.hexdigest()[:12]}.jsonl"
    if path.exists():
        return read_rows(path)
    return export_rows(cfg.taskset, path, taskset_overrides=cfg.taskset_args, venv=cfg.venv)


def load_env_server(
    cfg: EnvServerConfig, model: str, temperature: float, out_dir: Path
) -> EnvServerEnv:
    """The started environment of `cfg`: its side venv built if needed, its task rows (the JSONL
    files, else exported once from the taskset into `out_dir`), its server running, its
    tokenizer that of `model`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ensure_side_venv(cfg.venv, cfg.requirements)
    rows = read_rows(cfg.tasks) if cfg.tasks else exported_rows(cfg, out_dir)
    if not rows:
        raise ValueError(f"taskset {cfg.taskset}: no task rows ({cfg.tasks or 'exported'})")
    eval_rows = read_rows(cfg.eval_tasks) if cfg.eval_tasks else rows
    env = EnvServerEnv(cfg, rows, eval_rows, resolve_model(model), temperature, out_dir)
    return env.start()
