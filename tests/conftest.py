"""Shared fixtures: the real test data beside the repo, and real vf-vllm servers on the CPU."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlvr.server.process import EXACT_FLAGS

SHARED_DATA = Path(
    os.environ.get("RLVR_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


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


def _serve(model: str, log_dir: Path, extra: list[str] | None = None):
    from rlvr.server.process import VLLMServer

    flags = [*EXACT_FLAGS, *(extra or [])]
    server = VLLMServer(model, extra_args=flags, log_path=log_dir / "vf-vllm.log")
    server.start()
    return server


def serve_tiny(model_dir: Path, log_dir: Path):
    """A real vf-vllm (CPU) on the tiny model that can load LoRA adapters at run time (adapter
    sync; merged pushes work into it as well), takes a request's own chat template and serves
    the token-in `/inference/v1/generate` route verifiers 0.4 environments call."""
    from rlvr.server.launcher import lora_flags

    server = _serve(
        str(model_dir),
        log_dir,
        extra=[*lora_flags(16), "--trust-request-chat-template", "--enable-scale-out"],
    )
    server.model_dir = model_dir
    server.sampling_args = TINY_SAMPLING
    return server


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir, tmp_path_factory):
    """One real vf-vllm (CPU) on the tiny model (`serve_tiny`), shared by every integration
    test."""
    server = serve_tiny(tiny_model_dir, tmp_path_factory.mktemp("tiny-server"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bf16_server(request, tiny_model_dir, tmp_path_factory):
    """A server whose weights and log-probabilities are bfloat16: vf-vllm with --dtype
    bfloat16 where vLLM's CPU backend runs it, else the float32 `tiny_server` with rounding
    (`rounded`: the probe's tests apply `round_to_bf16`; the exact check's skip). Shared by
    the push probe's and the exact check's tests, one per module (its memory is freed after)."""
    from rlvr.server.process import VLLMServer

    flags = [f if f != "float32" else "bfloat16" for f in EXACT_FLAGS]
    log = tmp_path_factory.mktemp("tiny-bf16-server") / "vf-vllm.log"
    server = VLLMServer(str(tiny_model_dir), extra_args=flags, log_path=log, ready_timeout=600)
    try:
        server.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"vf-vllm did not start in bfloat16, rounding a float32 server instead: {e}")
        fallback = request.getfixturevalue("tiny_server")
        # log-probabilities rounded to bf16 are ~7x noisier than a bf16 server's (measured:
        # noise 1.2e-2 against 1.65e-3): steps that clear it in one push need a larger lr
        yield SimpleNamespace(server=fallback, rounded=True, broken_lr=1.5e-2)
        return
    server.model_dir = tiny_model_dir
    yield SimpleNamespace(server=server, rounded=False, broken_lr=2e-3)
    server.stop()


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory):
    """A real vf-vllm on the embedded SmolLM2-135M-Instruct (converted once into the cache)."""
    from rlvr.model.names import ensure_embedded_model
    from rlvr.server.launcher import lora_flags

    server = _serve("smollm2-135m", tmp_path_factory.mktemp("smollm2-server"), extra=lora_flags(16))
    server.model_dir = ensure_embedded_model()
    server.sampling_args = SMOLLM2_SAMPLING
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_adapter_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """A LoRA adapter (rank 8, random) on the tiny model, as training would leave it."""
    from rlvr.model.tiny_model import build_tiny_adapter

    return build_tiny_adapter(tiny_model_dir, tmp_path_factory.mktemp("adapters") / "tiny-lora")


@pytest.fixture(scope="session")
def tiny_lora_server(tiny_model_dir, tiny_adapter_dir, tmp_path_factory):
    """A real vf-vllm serving the tiny model and, with vLLM's LoRA support, `tiny_adapter_dir`
    on top of it, started the way sweeps and predictions serve an adapter directory. Requests
    name `server.model` (the base) or `server.adapter`."""
    from rlvr.server.serve_model import serve, served_model

    log = tmp_path_factory.mktemp("tiny-lora-server") / "vf-vllm.log"
    with serve(
        str(tiny_adapter_dir), name="tiny-lora", server_args=EXACT_FLAGS, log_path=log
    ) as endpoint:
        yield SimpleNamespace(
            base_url=endpoint.base_url,
            model=served_model(str(tiny_adapter_dir)).model,
            adapter=endpoint.model,
            model_dir=tiny_model_dir,
            adapter_dir=tiny_adapter_dir,
            sampling_args=TINY_SAMPLING,
            log=log,
        )


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
