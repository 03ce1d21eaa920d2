"""Helpers shared by the tests: served vs trainer log-probabilities, the trainer config every
integration test starts from, whether an engine rests between requests, launching the trainer in
fresh processes, and what a sample's loss mask covers (`masked_runs`)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from transformers import AutoTokenizer

from rlvr.config import load_config, save_config

LORA_TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"
ADAPTER_TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
"""LoRA targets vLLM can serve as an adapter (no lm_head): adapter sync."""


def server_logprobs(server, token_ids: list[int]) -> torch.Tensor:
    """vLLM's logprob of each token given its prefix (prompt_logprobs), for tokens 1..n-1."""
    body = {
        "model": server.model,
        "prompt": token_ids,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 0,
    }
    response = httpx.post(f"{server.base_url}/completions", json=body, timeout=120)
    response.raise_for_status()
    entries = response.json()["choices"][0]["prompt_logprobs"][1:]
    return torch.tensor(
        [entry[str(tok)]["logprob"] for entry, tok in zip(entries, token_ids[1:], strict=True)]
    )


def engine_processes(server) -> list:
    """The processes under a `VLLMServer`'s launcher: API server, engine core, any workers."""
    import psutil

    return psutil.Process(server.proc.pid).children(recursive=True)


def assert_engine_goes_idle(server) -> None:
    """After a request, the engine's processes use under 0.2 CPU-seconds in the next 0.5 s:
    none busy-waits for its next message (vLLM's workers spin a full second unpatched)."""
    import time

    processes = engine_processes(server)
    server_logprobs(server, [1, 2, 3])
    time.sleep(0.05)
    before = sum(sum(p.cpu_times()[:2]) for p in processes)
    time.sleep(0.5)
    busy = sum(sum(p.cpu_times()[:2]) for p in processes) - before
    names = sorted({p.name() for p in processes})
    assert busy < 0.2, f"{names} used {busy:.2f} CPU-seconds in 0.5 s while idle"


def trainer_logprobs(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0]


def measured(history: list[dict], key: str) -> list[float]:
    """`key` of the steps that logged it, at least one: a step whose groups all scored alike
    trains nothing and measures no mismatch-KL, entropy or ratio (`rlvr.trainer.loss`)."""
    values = [h[key] for h in history if key in h]
    assert values, f"none of {len(history)} steps measured {key}: none had signal"
    return values


def assert_push_checked(metrics: dict) -> None:
    """A step's push passed its check: the exact check (every parameter held as sent) where it
    ran, else the push probe (pushes into a quantized model)."""
    if "push/verified_params" in metrics:
        assert metrics["push/verified_params"] > 0 and metrics["push/failed_params"] == 0, metrics
    else:
        assert metrics["push/probe_kl"] < 1e-6, metrics


def target_id(model_dir) -> int:
    return AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("42")


def config(server, out, *extra):
    return load_config(
        overrides=[
            f"model.name={server.model_dir}",
            f"server.base_url={server.base_url}",
            f"server.served_model={server.model}",
            "batch.batch_size=32",
            "batch.rollouts_per_example=8",
            "batch.micro_batch_size=8",
            "batch.async_level=0",
            "sampling.max_tokens=16",
            "optim.lr=2e-2",
            f"lora.target_modules={LORA_TARGETS}",
            "seed=0",
            "wandb.mode=disabled",
            "logging.progress_bar=false",
            "checkpoint.every=0",
            f"output_dir={out}",
            *extra,
        ]
    )


RANK_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from toy_env import target_share_env
from rlvr.config import load_config
from rlvr.trainer.grpo import Trainer

trainer = Trainer(load_config({config!r}), env=target_share_env({target}))
history = trainer.run(stop_after={stop_after!r})
info = {{"rank": trainer.rank, "world": trainer.world,
         "type": str(trainer.accelerator.distributed_type), "history": history}}
with open(f"{{sys.argv[1]}}.{{trainer.rank}}.json", "w") as f:
    json.dump(info, f)
"""

ROOT = Path(__file__).resolve().parents[1]
ZERO3_CPU = ROOT / "configs" / "zero3_cpu.yaml"


def zero3_launch(processes: int = 2) -> list[str]:
    """`accelerate launch` of DeepSpeed ZeRO-3 on the CPU with `processes` ranks (the script
    and its arguments follow)."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config-file",
        str(ZERO3_CPU),
        "--num-processes",
        str(processes),
    ]


def launch(
    server, workdir: Path, command: list[str], extra: list[str], env=None, stop_after=None
) -> list[dict]:
    """Run the trainer (output in `workdir/run`) in fresh processes (`command` + a script);
    return each rank's report: rank, world, distributed type, history."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_config = workdir / "run.yaml"
    save_config(config(server, workdir / "run", *extra), run_config)
    script = workdir / "rank.py"
    tests = str(Path(__file__).resolve().parent)
    target = target_id(server.model_dir)
    script.write_text(
        RANK_SCRIPT.format(
            tests=tests, config=str(run_config), target=target, stop_after=stop_after
        )
    )
    for old in workdir.glob("report.*.json"):
        old.unlink()
    result = subprocess.run(
        [*command, str(script), str(workdir / "report")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads(p.read_text()) for p in sorted(workdir.glob("report.*.json"))]


def restore_base_weights(server) -> None:
    """Push the server's original model back: tests on the shared server push other weights
    (merged training steps), and a test that compares served log-probabilities with a model it
    builds from the model directory must start from those."""
    from transformers import AutoModelForCausalLM

    from rlvr.weight_sync.merged import MergedPush

    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    with MergedPush(server.base_url, server.model, backend="shm") as sync:
        sync.connect(model)
        sync.push(0)


@contextlib.contextmanager
def loaded_adapter(server, path, name: str):
    """The LoRA adapter at `path` loaded on `server` under `name` at run time, as adapter sync
    loads its versions; unloaded after. Yields `name`."""
    root = server.base_url.removesuffix("/v1")
    body = {"lora_name": name, "lora_path": str(path)}
    httpx.post(f"{root}/v1/load_lora_adapter", json=body, timeout=120).raise_for_status()
    try:
        yield name
    finally:
        httpx.post(f"{root}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Forwards each request to `server.upstream` and records (method, path, JSON body);
    answers a status of its own instead where `server.answer(path, body)` names one."""

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parsed = json.loads(body) if body else None
        self.server.requests.append((self.command, self.path, parsed))
        status = self.server.answer(self.path, parsed) if self.server.answer else None
        if status is not None:
            said = json.dumps({"error": {"message": f"the proxy answers {status}"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(said)))
            self.end_headers()
            self.wfile.write(said)
            return
        headers = {
            k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
        }
        answer = httpx.request(
            self.command,
            self.server.upstream + self.path,
            content=body,
            headers=headers,
            timeout=300,
        )
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def recording_proxy(server, answer: Callable[[str, dict | None], int | None] | None = None):
    """An HTTP proxy in front of a real vf-vllm that records every request it forwards:
    yields (base URL ending in /v1, list of (method, path, body)). `answer(path, body)`: a
    status the proxy answers itself instead of forwarding (None: forward)."""
    from rlvr.config.server import server_root

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    proxy.upstream = server_root(server.base_url)
    proxy.requests = []
    proxy.answer = answer
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}/v1", proxy.requests
    finally:
        proxy.shutdown()
        proxy.server_close()


def chat_requests(requests) -> list[dict]:
    """The chat-completion bodies among a proxy's recorded requests."""
    return [body for method, path, body in requests if path.endswith("/chat/completions")]


@contextlib.contextmanager
def json_server(routes: dict[str, dict]):
    """A stand-in server answering GET `path` with `routes[path]` (404 elsewhere): for a
    server configuration no real test server runs with. Yields its base URL (/v1)."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            body = json.dumps(routes[path]).encode() if path in routes else b"{}"
            self.send_response(200 if path in routes else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal stretches of consecutive loss tokens (mask 1) of a training sample, e.g. to
    decode and check what SFT or GRPO trains on."""
    runs: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask, strict=True)):
        if m and i and mask[i - 1]:
            runs[-1].append(token)
        elif m:
            runs.append([token])
    return runs


def in_transit(monkeypatch, change: Callable[[str, torch.Tensor], torch.Tensor]) -> None:
    """Make the shm transfer send `change(name, tensor)` instead of each tensor, after the
    exact check has fingerprinted what the trainer meant to send (a lossy transfer)."""
    import rlvr.server.cpu_engine as cpu_engine

    checked = cpu_engine.checked

    def lossy(source, metas):
        for meta, tensor in zip(metas, checked(source, metas), strict=True):
            yield change(meta.name, tensor)

    monkeypatch.setattr(cpu_engine, "checked", lossy)


def one_element_off_while(monkeypatch, on: Callable[[], bool], name: str) -> None:
    """Make the shm transfer send the tensor `name` with one element off (+1) while `on()`:
    a server that answers but does not hold what it was pushed."""

    def change(sent: str, tensor: torch.Tensor) -> torch.Tensor:
        if sent != name or not on():
            return tensor
        changed = tensor.clone()
        changed.view(-1)[0] += 1
        return changed

    in_transit(monkeypatch, change)
