"""Shared fixtures: the real test data beside the repo, and real vf-vllm servers on the CPU."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvr.server.process import EXACT_FLAGS

SHARED_DATA = Path(
    os.environ.get("RLVR_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


# The suite's servers hold few tokens at once (the tiny model's cache takes 2 KB a token,
# SmolLM2's 46 KB): 1 GiB of KV cache each, not the launcher's 2, keeps the servers that live at
# once (the shared ones, the demo's own, second servers) inside the CI machine's 24 GiB.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

REPO = Path(__file__).resolve().parents[1]
ENVSERVER_FIXTURES = REPO / "tests" / "fixtures" / "envserver" / "vf04_fixtures"


@pytest.fixture(scope="session")
def side_venv() -> Path:
    """The side venv of verifiers 0.4 with the fixture tasksets (`.venv-envserver` in the repo),
    built on first use: about 1.5 minutes once, then a stamp check."""
    from rlvr.envserver.side_venv import ensure_side_venv

    venv = REPO / ".venv-envserver"
    ensure_side_venv(venv, ["-e", str(ENVSERVER_FIXTURES)])
    return venv


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(
            f"test data not found at {SHARED_DATA}; set RLVR_SHARED_DATA to the shared/data folder"
        )
    return SHARED_DATA


# The tiny model's text is random: a minimum length keeps it from answering with nothing at all
# (which verifiers records as an error). Tests pass `server.sampling_args` to vf-eval.
TINY_SAMPLING = {"extra_body": {"min_tokens": 8}}
SMOLLM2_SAMPLING = {"extra_body": {"min_tokens": 1}}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlvr.model.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


def _serve(model: str, log_dir: Path, extra: list[str] | None = None, start: bool = True):
    from rlvr.server.process import VLLMServer

    flags = [*EXACT_FLAGS, *(extra or [])]
    server = VLLMServer(model, extra_args=flags, log_path=log_dir / "vf-vllm.log")
    return server.start() if start else server


def serve_tiny(model_dir: Path, log_dir: Path, start: bool = True):
    """A real vf-vllm (CPU) on the tiny model that can load LoRA adapters at run time (adapter
    sync; merged pushes work into it as well), takes a request's own chat template and serves
    the token-in `/inference/v1/generate` route verifiers 0.4 environments call."""
    from rlvr.server.launcher import lora_flags

    server = _serve(
        str(model_dir),
        log_dir,
        extra=[*lora_flags(16), "--trust-request-chat-template", "--enable-scale-out"],
        start=start,
    )
    server.model_dir = model_dir
    server.sampling_args = TINY_SAMPLING
    return server


Opener = Callable[[], AbstractContextManager]  # opens a server; called by its own thread


class Background:
    """A shared server started by a thread of its own, so that it starts while other tests run.

    The thread lives until `close`: a vf-vllm child ends with the thread that started it (the
    parent-death signal follows the thread), and a crashed run leaves no server behind. `after`
    starts it once another has started (one start at a time leaves a core to the tests)."""

    def __init__(self, open_server: Opener, after: Background | None):
        self._open, self._after = open_server, after
        self._started, self._done = threading.Event(), threading.Event()
        self._value: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._own, daemon=True)
        self._thread.start()

    def _own(self) -> None:
        if self._after is not None:
            self._after._started.wait()
        try:
            with self._open() as value:
                self._value = value
                self._started.set()
                self._done.wait()
        except BaseException as error:  # handed to the test that asks for the server
            self._error = error
        finally:
            self._started.set()

    def get(self) -> object:
        """The server once it serves (its start-up error, raised, otherwise)."""
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def close(self) -> None:
        self._done.set()
        self._thread.join()


@contextlib.contextmanager
def _running(server):
    try:
        yield server.start()
    finally:
        server.stop()


# The shared servers started as the session begins, in this order, when its tests use them.
# `tiny_lora_server` starts when first asked for: its users come after the tests that start
# servers of their own (the demo's SmolLM2, second servers), and four servers at once besides
# those would not fit in 24 GiB.
EARLY_SERVERS = ("tiny_server", "smollm2_server")


class SharedServers:
    """The session's shared servers by fixture name, each started in the background once."""

    def __init__(self) -> None:
        self.started: dict[str, Background] = {}
        self.begun = False

    def begin(self, request, tmp_path_factory) -> None:
        """Start, one after another beside the tests, the early servers the session's tests
        use (their directories and ports are chosen here, in the test's thread)."""
        self.begun = True
        wanted = {name for item in request.session.items for name in item.fixturenames}
        last = None
        for name in EARLY_SERVERS:
            if name in wanted and name not in self.started:
                opener = PREPARE[name](request, tmp_path_factory)
                last = self.started[name] = Background(opener, after=last)

    def get(self, name: str, request, tmp_path_factory) -> object:
        """The server once it serves; started now if the session did not start it (a test that
        asks for it by `request.getfixturevalue`, or one of the servers not started early)."""
        if name not in self.started:
            opener = PREPARE[name](request, tmp_path_factory)
            self.started[name] = Background(opener, after=None)
        return self.started[name].get()

    def close(self) -> None:
        for server in self.started.values():
            server.close()


@pytest.fixture(scope="session")
def shared_servers() -> Iterator[SharedServers]:
    servers = SharedServers()
    yield servers
    servers.close()


@pytest.fixture(autouse=True)
def _start_shared_servers(request, shared_servers: SharedServers, tmp_path_factory) -> None:
    """Start the shared servers as the session begins (a start is 45-90 s of mostly Python
    imports on one core; the modules that start no server run first, beside them:
    `pytest_collection_modifyitems`). Under `-n` (pytest-xdist) only the worker that runs the
    integration tests starts them, at its first one."""
    under_xdist = "PYTEST_XDIST_WORKER" in os.environ
    if not shared_servers.begun and (
        not under_xdist or request.node.get_closest_marker("integration")
    ):
        shared_servers.begin(request, tmp_path_factory)


def _tiny(request, tmp_path_factory) -> Opener:
    model_dir = request.getfixturevalue("tiny_model_dir")
    server = serve_tiny(model_dir, tmp_path_factory.mktemp("tiny-server"), start=False)
    return lambda: _running(server)


@pytest.fixture(scope="session")
def tiny_server(request, shared_servers, tmp_path_factory):
    """One real vf-vllm (CPU) on the tiny model (`serve_tiny`), shared by every integration
    test."""
    return shared_servers.get("tiny_server", request, tmp_path_factory)


@pytest.fixture(scope="module")
def bf16_server(tiny_model_dir, tmp_path_factory):
    """vf-vllm on the tiny model with --dtype bfloat16 (`server`), for the exact check's tests,
    one per module (its memory is freed after); `server` is None, with `why`, where vLLM's
    CPU backend does not run bfloat16 (the tests at that dtype skip)."""
    from rlvr.server.process import VLLMServer

    flags = [f if f != "float32" else "bfloat16" for f in EXACT_FLAGS]
    log = tmp_path_factory.mktemp("tiny-bf16-server") / "vf-vllm.log"
    server = VLLMServer(str(tiny_model_dir), extra_args=flags, log_path=log, ready_timeout=600)
    try:
        server.start()
    except (RuntimeError, TimeoutError) as e:
        yield SimpleNamespace(server=None, why=f"vf-vllm did not start in bfloat16: {e}")
        return
    server.model_dir = tiny_model_dir
    yield SimpleNamespace(server=server, why=None)
    server.stop()


def _smollm2(request, tmp_path_factory) -> Opener:
    from rlvr.model.names import ensure_embedded_model
    from rlvr.server.launcher import lora_flags

    log_dir = tmp_path_factory.mktemp("smollm2-server")
    server = _serve("smollm2-135m", log_dir, extra=lora_flags(16), start=False)
    server.model_dir = ensure_embedded_model()
    server.sampling_args = SMOLLM2_SAMPLING
    return lambda: _running(server)


@pytest.fixture(scope="session")
def smollm2_server(request, shared_servers, tmp_path_factory):
    """A real vf-vllm on the embedded SmolLM2-135M-Instruct (converted once into the cache)."""
    return shared_servers.get("smollm2_server", request, tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A LoRA adapter (rank 8, random) on the tiny model, as training would leave it."""
    from rlvr.model.tiny_model import build_tiny_adapter

    return build_tiny_adapter(tiny_model_dir, tmp_path_factory.mktemp("adapters") / "tiny-lora")


def _tiny_lora(request, tmp_path_factory) -> Opener:
    from rlvr.server.serve_model import serve, served_model

    model_dir = request.getfixturevalue("tiny_model_dir")
    adapter_dir = request.getfixturevalue("tiny_adapter_dir")
    log = tmp_path_factory.mktemp("tiny-lora-server") / "vf-vllm.log"

    @contextlib.contextmanager
    def opened() -> Iterator[SimpleNamespace]:
        with serve(str(adapter_dir), name="tiny-lora", server_args=EXACT_FLAGS, log_path=log) as up:
            yield SimpleNamespace(
                base_url=up.base_url,
                model=served_model(str(adapter_dir)).model,
                adapter=up.model,
                model_dir=model_dir,
                adapter_dir=adapter_dir,
                sampling_args=TINY_SAMPLING,
                log=log,
            )

    return opened


@pytest.fixture(scope="session")
def tiny_lora_server(request, shared_servers, tmp_path_factory):
    """A real vf-vllm serving the tiny model and, with vLLM's LoRA support, `tiny_adapter_dir`
    on top of it, started the way sweeps and predictions serve an adapter directory. Requests
    name `server.model` (the base) or `server.adapter`."""
    return shared_servers.get("tiny_lora_server", request, tmp_path_factory)


@pytest.fixture
def smollm2_adapter(smollm2_server, tmp_path):
    """A random LoRA adapter on SmolLM2 (a Llama: vLLM wraps its logits processor for LoRA),
    loaded at run time as adapter sync loads its versions (its name); unloaded after."""
    from support import loaded_adapter

    from rlvr.model.tiny_model import build_tiny_adapter

    path = build_tiny_adapter(smollm2_server.model_dir, tmp_path / "adapter")
    with loaded_adapter(smollm2_server, path, "scored-adapter") as name:
        yield name


# How each shared server is prepared (in the test's thread: directories, ports) into the opener
# its own thread runs.
PREPARE: dict[str, Callable[..., Opener]] = {
    "tiny_server": _tiny,
    "smollm2_server": _smollm2,
    "tiny_lora_server": _tiny_lora,
}


@pytest.fixture(scope="module")
def rv_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a copy of every non-special token."""
    from rlvr.config import ModelConfig
    from rlvr.reasoning_vocab.expand import expand_checkpoint

    cfg = ModelConfig(name=str(tiny_model_dir), reasoning_vocab_size=-1)
    return expand_checkpoint(cfg, tmp_path_factory.mktemp("models") / "tiny-rv")


@pytest.fixture(scope="module")
def gate(rv_model_dir):
    """The think gate of `rv_model_dir`."""
    from rlvr.reasoning_vocab.gate import ThinkGate
    from rlvr.reasoning_vocab.mapping import ReasoningVocab, load_tokenizer

    return ThinkGate.from_tokenizer(ReasoningVocab.load(rv_model_dir), load_tokenizer(rv_model_dir))


def starts_servers(module: str | Path) -> bool:
    """Whether a test module may start servers: those under tests/integration/ and the
    environments' `*_integration.py` (an `integration` test anywhere else is refused)."""
    path = Path(module).as_posix()
    return "tests/integration/" in path or path.endswith("_integration.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that start no server run first, while the shared servers start beside them
    (`_start_shared_servers`); under xdist the server modules come first instead, so that one
    worker takes them at once (`pytest_xdist_make_scheduler`). A module's tests stay together
    and in order, so its fixtures are built once."""
    astray = [i.nodeid for i in items if i.get_closest_marker("integration")]
    astray = [nodeid for nodeid in astray if not starts_servers(nodeid.split("::")[0])]
    if astray:
        raise pytest.UsageError(
            f"integration tests outside tests/integration/ or a *_integration.py: {astray[:3]}"
        )
    servers_first = "PYTEST_XDIST_WORKER" in os.environ
    items.sort(key=lambda item: starts_servers(item.path) != servers_first)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown where xdist is not loaded
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two workers (`-n 2`): one runs every module that may start servers, in
    collection order, on one set of shared servers (two sets would not fit in 24 GiB); the
    other takes the remaining modules one whole module at a time."""
    from xdist.scheduler import LoadScopeScheduling

    class ServersApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "servers" if starts_servers(module) else module

    config.option.loadscopereorder = False  # the collection's order: the servers' unit first
    return ServersApart(config, log)


# ---- the duration budget (tests/budget.py) -------------------------------------------------------

_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record each test's call time (a shared fixture's set-up falls on whichever test asks for
    it first: `--durations` shows set-ups)."""
    if report.when == "call":
        _durations[report.nodeid] = report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """Name the tests over the budget that tests/budget.py does not list."""
    from budget import BUDGET_S, over_budget

    late = over_budget(_durations)
    if late:
        terminalreporter.section(f"over the {BUDGET_S:.0f} s budget, not in tests/budget.py")
        for nodeid, seconds in late:
            terminalreporter.line(f"{seconds:7.1f}s {nodeid}")
