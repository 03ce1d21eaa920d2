"""`server.*`: the run's vf-vllm servers, how weights reach them and how pushes are checked.

Each field is checked by `ServerConfig.validate`. Design: docs/scaling.md#several-inference-servers
and docs/weight-transfer.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rlvr.config.checks import ConfigError, require

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
"""The server a run talks to when the config names none (vf-vllm's default port)."""


@dataclass
class ServerConfig:
    """`server.*`: the vf-vllm server, and how weights reach it."""

    base_url: str | None = None
    """The one vf-vllm (None: `DEFAULT_BASE_URL`). Several servers: `base_urls` instead."""
    base_urls: list[str] = field(default_factory=list)
    """Several vf-vllm servers serving the same model: each group of rollouts goes to one of
    them, every weight version to all of them, and the run goes on while at least one answers.
    Set this or `base_url`, not both (docs/scaling.md#several-inference-servers)."""
    fleet_file: str | None = None
    """A file listing the run's servers, one URL a line (`#` comments and blank lines
    ignored), instead of `base_url`/`base_urls`. Read again at every push: a URL added joins
    (checked, pushed the current version and verified before any group goes to it), a URL
    removed is drained (its groups in flight finish, it takes no new ones) and let go.
    Replace the file whole (write another, then `mv`), not line by line
    (docs/scaling.md#the-fleet-file)."""
    api_key: str | None = None
    served_model: str | None = None
    """The name vf-vllm serves the model under (default: model.name, as vf-vllm does)."""
    backend: Literal["auto", "shm", "gloo", "nccl", "ipc"] = "auto"
    """Weight transfer: nccl (server on other GPUs), ipc (server on the trainer's GPU), shm
    (CPU server on this host), gloo (CPU server elsewhere). auto: nccl when the trainer has
    CUDA, else shm for a local server, else gloo."""
    timeout_s: float = 600.0
    """Per-request timeout for generation and control calls: a server that does not answer a
    request within it is taken out of rotation (with several servers) or fails the run."""
    hang_s: float = 20.0
    """A server with groups in flight that answers no health check for this long is taken out
    of rotation and its groups run again elsewhere, however long `timeout_s` is (a stopped or
    stuck host). 0: rely on `timeout_s` alone (`rlvr.rollouts.health`)."""
    health_every_s: float = 5.0
    """How often the health of servers with groups in flight is asked (each ask waits at most
    this long)."""
    start_wait_s: float = 300.0
    """How long start-up waits for a server to answer its health check (a trainer started
    beside servers that are still loading), saying so every 30 s, then up to 30 s more for the
    others (those still silent join once they answer); with none answering it stops, naming
    the URLs. 0: do not wait."""
    transfer_host: str | None = None
    """Address of the trainer's first node that vf-vllm's workers connect to for the gloo or
    nccl weight transfer. None: this machine's address on its route to the server (loopback
    for a local server). Set it where that guess is wrong (NAT, several interfaces)."""
    transfer_port: int = 0
    """Port of that rendezvous (0: any free port; fix one for firewalls)."""
    transfer_timeout_s: float = 300.0
    """Deadline for the transfer rendezvous and each transfer's collectives: a wrong or
    unreachable address fails after this long, naming both addresses and the port."""
    lora_sync: Literal["auto", "adapter", "merged"] = "auto"
    """How a LoRA policy reaches the server. adapter: push only the adapter (megabytes); vLLM
    serves it on its frozen base under `adapter_name` (needs vf-vllm --enable-lora). merged:
    stream base + adapter merged, as for full fine-tuning. auto: adapter whenever the server
    can serve it, else merged (the log says why)."""
    adapter_name: str = "policy"
    """Adapter sync serves weight version v as `{adapter_name}-v{v}`; each rollout requests
    the version its batch is tagged with. One trainer per name on a server: a trainer unloads
    the versions under its name that it finds at start (a dead trainer's)."""
    push_weights: bool = True
    """Push weights after every optimizer step (the initial weights are pushed regardless).
    Off only for debugging: rollouts then come from the initial weights."""
    exact_check: bool = True
    """After every push, compare a fingerprint of every parameter the server's layers compute
    with (merged pushes) or of every adapter matrix it stored (adapter pushes) against what was
    sent, exactly (`push/verify_seconds`, `push/verified_params`, `push/failed_params`); a
    server that differs is pushed again once, then taken out, named with what differs (see
    rlvr.weight_sync.exact_check)."""
    push_probe: bool = True
    """Check that each server's model is the trainer's: score a fixed token sequence on the
    server (prompt log-probabilities of the name rollouts will request) and with the trainer's
    weights, and hold their mismatch (`push/probe_kl`) to an absolute limit, at a server's
    first push (start, resume, return) and at every push the exact check does not cover (see
    rlvr.weight_sync.probe)."""
    probe_kl_max: float | None = None
    """The most `push/probe_kl` the probe allows. None: 1e-2 (a bf16 server against a float32
    trainer measures ~1e-3 on SmolLM2, another model far more)."""

    @property
    def urls(self) -> list[str]:
        """Every server of the run at start, in the order their metrics are numbered
        (`servers/<i>/*`; servers that join from the fleet file later are numbered on)."""
        if self.fleet_file:
            return read_fleet_file(self.fleet_file)
        return list(self.base_urls) or [self.base_url or DEFAULT_BASE_URL]

    def validate(self) -> None:
        given = [name for name in ("base_url", "base_urls", "fleet_file") if getattr(self, name)]
        require(
            len(given) <= 1,
            "server." + "/".join(given),
            tuple(getattr(self, name) for name in given),
            "set one: base_url for one server, base_urls for several, fleet_file for a fleet "
            "that changes during the run",
        )
        if self.fleet_file:
            read_fleet_file(self.fleet_file)  # checked now, read again at every push
        else:
            field_name = "server.base_urls" if self.base_urls else "server.base_url"
            check_server_urls(self.urls, field_name)
        require(self.timeout_s > 0, "server.timeout_s", self.timeout_s)
        require(self.start_wait_s >= 0, "server.start_wait_s", self.start_wait_s)
        require(self.hang_s >= 0, "server.hang_s", self.hang_s, "0 turns the health watch off")
        require(self.health_every_s > 0, "server.health_every_s", self.health_every_s)
        require(
            self.hang_s == 0 or self.hang_s > self.health_every_s,
            "server.hang_s",
            self.hang_s,
            f"must exceed server.health_every_s ({self.health_every_s}): a server is asked "
            "at least once before it is judged",
        )
        require(self.transfer_timeout_s > 0, "server.transfer_timeout_s", self.transfer_timeout_s)
        require(
            self.probe_kl_max is None or self.probe_kl_max > 0,
            "server.probe_kl_max",
            self.probe_kl_max,
        )
        require(
            0 <= self.transfer_port < 65536,
            "server.transfer_port",
            self.transfer_port,
            "must be a port number (0: any free port)",
        )


def server_root(base_url: str) -> str:
    """A server's root from its OpenAI base URL (".../v1") or the root itself: what identifies
    a server in a list of URLs, and where its non-OpenAI routes live."""
    return base_url.rstrip("/").removesuffix("/v1")


def auth_header(api_key: str | None) -> dict[str, str]:
    """The header that carries `server.api_key` to a server (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def check_server_urls(urls: list[str], field_name: str) -> None:
    """Every URL is http(s) and names a different server; ConfigError naming `field_name`."""
    for i, url in enumerate(urls):
        require(
            url.startswith(("http://", "https://")),
            f"{field_name}[{i}]" if len(urls) > 1 else field_name,
            url,
            "must be an http(s) URL such as http://127.0.0.1:8000/v1",
        )
    keys = [server_root(url) for url in urls]
    require(len(set(keys)) == len(keys), field_name, urls, "lists a server twice")


def read_fleet_file(path: str) -> list[str]:
    """The server URLs `path` lists, one a line, in order (`#` comments and blank lines
    skipped); ConfigError when it cannot be read, lists none, or lists a bad or repeated URL."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"server.fleet_file={path!r}: cannot be read ({e})") from None
    urls = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    urls = [url for url in urls if url]
    require(bool(urls), "server.fleet_file", path, "lists no server URL")
    check_server_urls(urls, f"server.fleet_file ({path})")
    return urls
