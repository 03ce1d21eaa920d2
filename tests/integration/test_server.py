"""vf-vllm as users run it: our launcher, clear start-up errors, and no orphaned engines."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from unit.server.test_server import VF_VLLM


def engine_processes(marker: str) -> list[str]:
    """API-server processes whose command line carries one test's unique served-model-name."""
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def alive(pids: list[int]) -> list[int]:
    import psutil

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p for p in pids if running(p)]


def gone_within(seconds: float, still_there: Callable[[], list]) -> list:
    """Poll until nothing is left (killed processes holding much memory take a while to go)."""
    deadline = time.monotonic() + seconds
    while (left := still_there()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@dataclass
class Launch:
    """vf-vllm started as a user starts it (`vf-vllm --model ... --port ...`), serving `marker`
    (a name unique to its test); its console goes to `log`."""

    proc: subprocess.Popen
    marker: str
    port: int
    log: Path

    def serving(self) -> Launch:
        """Wait until it serves (or fail with its log)."""
        deadline = time.monotonic() + 600
        while "vf-vllm: serving" not in self.log.read_text():
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(1)
        assert f"http://127.0.0.1:{self.port}/v1" in self.log.read_text()
        return self

    def exited(self) -> Launch:
        """Wait until it exits by itself."""
        self.proc.wait(600)
        return self


def launch(model_dir: Path, name: str, log_dir: Path) -> Launch:
    from rlvr.weight_sync.rendezvous import free_port

    marker, port = f"{name}-{uuid.uuid4().hex[:8]}", free_port()
    log = log_dir / f"{name}.log"
    args = ["--model", str(model_dir), "--served-model-name", marker, "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [VF_VLLM, *args, "--enforce-eager", "--dtype", "float32"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Launch(proc, marker, port, log)


@pytest.fixture(scope="module")
def launches(tiny_model_dir, tmp_path_factory) -> Iterator[dict[str, Launch]]:
    """The module's own launchers, started at once: each test below ends its launcher its own
    way (an engine that dies on corrupt weights, SIGINT, SIGKILL), so none can use a shared
    server, and a start is mostly Python imports that two cores run side by side. Yielded once
    the broken one has exited and the others serve; whatever still runs at the end is
    SIGKILLed."""
    logs = tmp_path_factory.mktemp("launchers")
    # a model directory whose weights file is corrupt passes our checks but kills the engine
    broken = logs / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    started = {
        "broken": launch(broken, "broken", logs),
        "sigint": launch(tiny_model_dir, "sigint", logs),
        "sigkill": launch(tiny_model_dir, "sigkill", logs),
    }
    try:
        started["broken"].exited()
        started["sigint"].serving()
        started["sigkill"].serving()
        yield started
    finally:
        for one in started.values():
            if one.proc.poll() is None:
                os.kill(one.proc.pid, signal.SIGKILL)
            one.proc.wait()


@pytest.mark.integration
def test_engine_failure_shows_log_tail_and_leaves_nothing_running(launches):
    broken = launches["broken"]
    console = broken.log.read_text()
    assert broken.proc.returncode == 2
    assert "exited with code" in console
    assert "last engine log lines" in console
    assert gone_within(30, lambda: engine_processes(broken.marker)) == []


def engine_tree(launcher: subprocess.Popen, marker: str) -> list[int]:
    """The API server, the engine core and its workers: every descendant of the launcher."""
    import psutil

    tree = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
    assert len(tree) >= 2 and engine_processes(marker), tree
    return tree


def port_free(port: int) -> bool:
    from rlvr.server.launcher import port_in_use

    return not port_in_use("127.0.0.1", port)


@pytest.mark.integration
@pytest.mark.slow
def test_sigint_stops_the_whole_engine_tree(launches):
    served = launches["sigint"]
    tree = engine_tree(served.proc, served.marker)
    served.proc.send_signal(signal.SIGINT)
    served.proc.wait(60)
    assert gone_within(30, lambda: alive(tree)) == []


@pytest.mark.integration
@pytest.mark.slow
def test_vf_vllm_sigkill_leaves_no_orphans(launches):
    """A SIGKILLed launcher cannot clean up: its API server's parent-death signal and its
    watchdog stop vLLM's whole process group, and the port is free again within seconds."""
    served = launches["sigkill"]
    tree = engine_tree(served.proc, served.marker)
    assert not port_free(served.port)
    os.kill(served.proc.pid, signal.SIGKILL)
    served.proc.wait(10)
    # the tree holds the watchdog too: it exits once the group is gone
    gone = gone_within(20, lambda: alive(tree) + [served.port] * (not port_free(served.port)))
    assert gone == []
    assert engine_processes(served.marker) == []


@pytest.mark.integration
def test_concurrent_seeded_long_prompts_do_not_kill_the_cpu_engine(tiny_server):
    """More prompt tokens at once than one engine step takes: with chunked prefill (vLLM's
    default) the engine split them, rewound a CPU generator and died. The launcher turns
    chunking off on CPU, so seeded requests (the trainer's default) are safe, and a seed
    still fixes the sample."""
    import asyncio

    import httpx
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_server.model_dir)
    prompts = [f"{i} " + "the fox runs far " * 300 for i in range(12)]
    assert sum(len(tokenizer(p)["input_ids"]) for p in prompts) > 4 * 4096

    async def complete(client: httpx.AsyncClient, prompt: str, seed: int) -> str:
        body = {
            "model": tiny_server.model,
            "prompt": prompt,
            "max_tokens": 8,
            "min_tokens": 8,
            "temperature": 1.0,
            "seed": seed,
        }
        response = await client.post(f"{tiny_server.base_url}/completions", json=body)
        response.raise_for_status()
        return response.json()["choices"][0]["text"]

    async def run_all() -> list[str]:
        async with httpx.AsyncClient(timeout=300) as client:
            requests = [complete(client, p, seed=i) for i, p in enumerate(prompts)]
            return await asyncio.gather(*requests, complete(client, prompts[0], seed=0))

    texts = asyncio.run(run_all())
    assert texts[-1] == texts[0]
    assert httpx.get(f"{tiny_server.root_url}/health", timeout=10).status_code == 200
