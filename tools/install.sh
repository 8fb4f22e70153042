#!/usr/bin/env bash
# Mizuoto's environments. Engines install into an existing environment without moving anything
# it has: --no-deps, with constraints that pin every installed package at its version
# (tools/engine_env.py); afterwards the environment is checked (only additions; pip check clean
# but for the upstream declarations each requirements file accepts).
#
#   tools/install.sh                   .venv: a ComfyUI environment (requirements/comfyui-env.txt:
#                                      ComfyUI v0.8.0, torch 2.14.1, torchaudio 2.11.1,
#                                      transformers 5.24.0), every engine, Mizuoto itself (editable)
#   tools/install.sh --engines PYTHON  every engine into the environment of PYTHON (ComfyUI's)
#   tools/install.sh --core            .venv-core: runtime + tests only (torch 2.13 CPU, no engine),
#                                      with the contract tools (ruff, mypy, import-linter)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
ENGINE_FILES=(requirements/qwen3tts.txt requirements/f5tts.txt requirements/omnivoice.txt requirements/voxcpm2.txt requirements/fishspeech.txt requirements/cosyvoice.txt requirements/gptsovits.txt requirements/indextts2.txt requirements/chatterbox.txt)

install_engines() {  # $1: the environment's python; then extra `pip install` arguments
  local py=$1 tmp args=()
  shift
  tmp=$(mktemp -d)
  for f in "${ENGINE_FILES[@]}"; do args+=(-r "$f"); done
  if [ -f requirements.txt ]; then args+=(-r requirements.txt); fi
  "$py" tools/engine_env.py constraints constraints-engines.txt > "$tmp/constraints.txt"
  "$py" -m pip install -q --no-deps -c "$tmp/constraints.txt" "${args[@]}" "$@"
  rm -r "$tmp"
}

if [ "${1:-}" = "--core" ]; then
  "$python" -m venv .venv-core
  .venv-core/bin/pip install -q -c constraints-core.txt -e '.[test,dev]'
  exit 0
fi
if [ "${1:-}" = "--engines" ]; then
  target=${2:?usage: tools/install.sh --engines PYTHON}
  before=$(mktemp)
  "$target" tools/engine_env.py snapshot > "$before"
  install_engines "$target"
  "$target" tools/engine_env.py verify "$before" "${ENGINE_FILES[@]}"
  exit 0
fi
"$python" -m venv .venv
.venv/bin/pip install -q --no-deps -r requirements/comfyui-env.txt
.venv/bin/python tools/engine_env.py snapshot > .venv/comfyui-env-before.txt
install_engines .venv/bin/python -e .
.venv/bin/python tools/engine_env.py verify .venv/comfyui-env-before.txt "${ENGINE_FILES[@]}"
