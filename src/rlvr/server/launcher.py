"""`vf-vllm`: vLLM's OpenAI-compatible server with the RL weight-update routes switched on.

The weight routes replace the served model, so the server binds 127.0.0.1 unless `--host` opens
it on purpose. Every argument we do not define is passed to vLLM unchanged. The launcher stays
in the foreground: it prints where it serves once the engine is ready and, on SIGINT/SIGTERM,
takes the whole engine process tree down with it; if it is killed outright, its parent-death
signal and watchdog do that (rlvr.server.lifetime).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from rlvr.config.server import auth_header
from rlvr.model.names import resolve_model
from rlvr.reasoning_vocab.mapping import ReasoningVocab
from rlvr.server.lifetime import dies_with, start_watchdog
from rlvr.server.plugin import REASONING_VOCAB_PROCESSOR, REASONING_VOCAB_TOKENIZER_MODE
from rlvr.weight_sync.vllm_lora import lora_rank_limit

LOG_TAIL_LINES = 60
CPU_KVCACHE_GIB = 2
CPU_MEMORY_FRACTION = "0.5"
CHUNKED_PREFILL_FLAGS = ("--enable-chunked-prefill", "--no-enable-chunked-prefill")
SCALE_OUT_FLAGS = ("--enable-scale-out", "--no-enable-scale-out")
WORKER_EXTENSION = "rlvr.server.worker_extension.WorkerExtension"


class LaunchError(RuntimeError):
    """A start-up failure with a message meant for the user (no traceback)."""


class Stopped(Exception):
    """SIGINT/SIGTERM arrived; unwinds the main thread so cleanup runs outside the handler."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def has_cuda() -> bool:
    """Return whether torch sees a CUDA device (False when torch is not installed)."""
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def build_parser() -> argparse.ArgumentParser:
    """Return vf-vllm's parser; arguments it does not know pass through to vLLM."""
    parser = argparse.ArgumentParser(
        prog="vf-vllm",
        description=(
            "rlvr's vf-vllm: start vLLM's OpenAI-compatible server with the RL routes "
            "(/pause, /resume, /init_weight_transfer_engine, /update_weights) enabled. "
            "Any other argument is passed to vLLM unchanged "
            "(e.g. --tensor-parallel-size, --max-model-len, --enable-lora, --enforce-eager)."
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        help="smollm2-135m (the embedded default), a local model directory, or a HF id",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None, help="require this bearer key on requests")
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="name clients use for the model (default: the --model string as given)",
    )
    parser.add_argument(
        "--weight-transfer-backend",
        default="auto",
        help="nccl, ipc (server on the trainer's GPU), cpu (our shm/gloo engine); "
        "auto: nccl on CUDA, else cpu",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for the engine to come up",
    )
    return parser


def port_in_use(host: str, port: int) -> bool:
    """Return whether `port` on `host` cannot be bound now (so vLLM would fail late)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host != "0.0.0.0" else "", port))
        except OSError:
            return True
    return False


def has_flag(passthrough: list[str], flag: str) -> bool:
    """Return whether `flag` appears in `passthrough`, as `--flag` or `--flag=value`."""
    return any(a == flag or a.startswith(flag + "=") for a in passthrough)


def reasoning_vocab_args(model_path: str, passthrough: list[str]) -> list[str]:
    """A model directory with a reasoning vocabulary is served with its think gate (a logits
    processor) and the tokenizer mode that decodes its reasoning ids as their originals."""
    if ReasoningVocab.load(model_path) is None:
        return []
    for flag in ("--logits-processors", "--tokenizer-mode"):
        if has_flag(passthrough, flag):
            raise LaunchError(
                f"{model_path} has a reasoning vocabulary: vf-vllm sets {flag} itself "
                f"(--logits-processors {REASONING_VOCAB_PROCESSOR} "
                f"--tokenizer-mode {REASONING_VOCAB_TOKENIZER_MODE}); drop yours"
            )
    return [
        "--logits-processors",
        REASONING_VOCAB_PROCESSOR,
        "--tokenizer-mode",
        REASONING_VOCAB_TOKENIZER_MODE,
    ]


def vllm_command(args: argparse.Namespace, passthrough: list[str], cuda: bool) -> list[str]:
    """The api_server command line: our defaults first, the user's own flags override them."""
    model_path = resolve_model(args.model)
    backend = args.weight_transfer_backend
    if backend == "auto":
        backend = "nccl" if cuda else "cpu"
    elif backend in ("shm", "gloo"):  # the trainer picks the transport of the cpu engine
        backend = "cpu"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--served-model-name",
        args.served_model_name or args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--weight-transfer-config",
        json.dumps({"backend": backend}),
    ]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    if not has_flag(passthrough, "--generation-config"):
        # vLLM otherwise applies the model's generation_config.json (top_k, top_p, min_p,
        # repetition_penalty) to every request that does not set them, and the trainer, which
        # sets every sampling field itself, would train against a distribution it cannot see.
        cmd += ["--generation-config", "vllm"]
    if not has_flag(passthrough, "--worker-extension-cls"):
        # Lets the trainer ask where the workers run (rlvr.server.worker_extension).
        cmd += ["--worker-extension-cls", WORKER_EXTENSION]
    if not has_flag(passthrough, "--logprobs-mode"):
        # Sampling logprobs after temperature: the distribution the tokens were drawn from,
        # which the trainer's importance ratio compares against (vLLM's default is raw).
        cmd += ["--logprobs-mode", "processed_logprobs"]
    if not cuda and not has_flag(passthrough, "--gpu-memory-utilization"):
        cmd += ["--gpu-memory-utilization", CPU_MEMORY_FRACTION]
    if not cuda and not any(has_flag(passthrough, f) for f in CHUNKED_PREFILL_FLAGS):
        # vLLM continues a seeded request whose prefill was split across steps by rewinding
        # its generator's offset, which CPU generators do not have: the engine dies
        # ("CPU Generator does not use offset"). Whole-prompt prefills never rewind, and the
        # trainer seeds every request.
        cmd += ["--no-enable-chunked-prefill"]
    if not any(has_flag(passthrough, f) for f in SCALE_OUT_FLAGS):
        # vLLM's token-in generate route, which verifiers 0.4 environments sample through
        # (rlvr.envserver.bridge): on by default, so no server of a run lacks it.
        cmd += ["--enable-scale-out"]
    cmd += reasoning_vocab_args(model_path, passthrough)
    return cmd + lora_defaults(passthrough) + passthrough


DEFAULT_MAX_LORA_RANK = 64
DEFAULT_MAX_LORAS = 2


def lora_flags(rank: int = DEFAULT_MAX_LORA_RANK, max_loras: int = DEFAULT_MAX_LORAS) -> list[str]:
    """vf-vllm flags that let the server load adapters of `rank` at run time (adapter sync;
    the policy's adapter plus one more, e.g. an evaluated checkpoint)."""
    limit = lora_rank_limit(rank)
    return ["--enable-lora", "--max-lora-rank", str(limit), "--max-loras", str(max_loras)]


def lora_defaults(passthrough: list[str]) -> list[str]:
    """With --enable-lora: a max rank that fits common adapters (vLLM's own default, 16, is
    smaller than many runs use) and room for two adapters, unless given."""
    if not has_flag(passthrough, "--enable-lora"):
        return []
    out = []
    if not has_flag(passthrough, "--max-lora-rank"):
        out += ["--max-lora-rank", str(DEFAULT_MAX_LORA_RANK)]
    if not has_flag(passthrough, "--max-loras"):
        out += ["--max-loras", str(DEFAULT_MAX_LORAS)]
    return out


def weight_backend(cmd: list[str]) -> str:
    """Return the backend named in the command's `--weight-transfer-config`."""
    return json.loads(cmd[cmd.index("--weight-transfer-config") + 1])["backend"]


def flag_value(passthrough: list[str], names: tuple[str, ...], default: str) -> str:
    """The value of the last of `names` in `passthrough` (`--x 2` or `--x=2`), else default."""
    value = default
    for i, arg in enumerate(passthrough):
        for name in names:
            if arg == name and i + 1 < len(passthrough):
                value = passthrough[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def local_workers(passthrough: list[str]) -> int:
    """How many worker processes vLLM runs here: data x pipeline x tensor parallel."""
    sizes = (
        ("--data-parallel-size", "-dp"),
        ("--pipeline-parallel-size", "-pp"),
        ("--tensor-parallel-size", "-tp"),
    )
    return math.prod(int(flag_value(passthrough, names, "1")) for names in sizes)


def cpu_thread_binding(workers: int, cores: list[int]) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for `workers` CPU workers: disjoint slices of `cores`
    (`0|1` for two workers on two cores), or one core each, reused, when there are fewer
    cores than workers. vLLM binds several CPU workers only by NUMA node otherwise, and
    refuses to start with more workers than nodes, which is every single-socket machine."""
    cores = sorted(cores)
    if len(cores) < workers:
        return "|".join(str(cores[i % len(cores)]) for i in range(workers))
    share = len(cores) // workers
    slices = [cores[i * share : (i + 1) * share] for i in range(workers)]
    return "|".join(",".join(map(str, s)) for s in slices)


def engine_env(cuda: bool, backend: str, workers: int = 1, lora: bool = False) -> dict[str, str]:
    """Return the environment the vLLM engine runs with (dev routes on, backend needs)."""
    env = dict(os.environ)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if lora:  # /v1/load_lora_adapter: how the trainer pushes an adapter (rlvr.weight_sync.adapter)
        env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    if backend == "ipc":  # CUDA IPC handles travel pickled over HTTP
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if not cuda:
        # Per worker: tensor-parallel workers each cache only their share of the heads.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, CPU_KVCACHE_GIB // workers)))
        if workers == 1:
            # One CPU worker runs inside the engine-core process (vLLM's "uni" executor) rather
            # than a third process: the server is ready 18-24 s sooner and decodes 1.5-1.8x
            # faster on two cores (docs/benchmarks.md#one-cpu-worker). The name misleads: the
            # engine core still runs beside the API server.
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if workers > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env:
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_thread_binding(
                workers, list(os.sched_getaffinity(0))
            )
    return env


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, api_key: str | None) -> None:
    """Return once `url` answers 200; LaunchError if the engine exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    headers = auth_header(api_key)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"the vLLM engine exited with code {proc.returncode} before ready")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.5)
    raise LaunchError(f"the vLLM engine was not ready after {timeout:.0f}s")


def stop_tree(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """Terminate the engine's whole process group (API server, engine core, workers)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:  # children may outlive the leader; make sure none is left
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def pump(stream, tail: collections.deque[str]) -> None:
    """Copy the engine's output to stdout line by line, keeping the last lines in `tail`."""
    for line in iter(stream.readline, ""):
        tail.append(line)
        sys.stdout.write(line)
        sys.stdout.flush()


def run(argv: list[str] | None = None) -> int:
    """Start the vLLM engine for `argv`, serve until it exits and return its exit code."""
    args, passthrough = build_parser().parse_known_args(argv)
    if port_in_use(args.host, args.port):
        raise LaunchError(f"port {args.port} on {args.host} is already in use; pick --port")
    cuda = has_cuda()
    cmd = vllm_command(args, passthrough, cuda)
    proc = subprocess.Popen(
        cmd,
        env=engine_env(
            cuda,
            weight_backend(cmd),
            local_workers(passthrough),
            lora=has_flag(passthrough, "--enable-lora"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, which vLLM's processes join
        preexec_fn=dies_with(os.getpid()),
    )
    watchdog = start_watchdog(proc.pid)  # stops that group if this process is SIGKILLed
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    threading.Thread(target=pump, args=(proc.stdout, tail), daemon=True).start()

    def on_signal(signum, _frame):
        # Only unwind here: cleaning up inside the handler would re-enter Popen.wait(), which
        # the interrupted main thread still holds a lock for.
        raise Stopped(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        return serve(args, cmd, proc, tail)
    except Stopped as stop:
        return 128 + stop.signum
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut cleanup
            signal.signal(signum, signal.SIG_IGN)
        stop_tree(proc)
        watchdog.stdin.close()  # nothing left to watch: it finds the group gone and exits
        watchdog.wait()


def serve(args, cmd: list[str], proc: subprocess.Popen, tail: collections.deque[str]) -> int:
    """Wait for the engine to be ready, announce it, and return its exit code when it stops."""
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    base = f"http://{host}:{args.port}"
    try:
        wait_ready(f"{base}/v1/models", proc, args.ready_timeout, args.api_key)
    except LaunchError as e:
        stop_tree(proc)
        time.sleep(0.2)  # let the pump thread flush the last lines
        raise LaunchError(f"{e}\n--- last engine log lines ---\n{''.join(tail)}") from None
    name = args.served_model_name or args.model
    print(f"vf-vllm: serving {name} at {base}/v1 (weight transfer: {weight_backend(cmd)})")
    sys.stdout.flush()
    return proc.wait()


def main(argv: list[str] | None = None) -> None:
    """The `vf-vllm` command: exit with the engine's code, or 2 with a one-line error."""
    try:
        sys.exit(run(argv))
    except (LaunchError, FileNotFoundError) as e:
        print(f"vf-vllm: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
