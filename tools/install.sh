#!/usr/bin/env bash
# Creates .venv with Mizuoto, its test tools and the Qwen3-TTS engine, on the stack ComfyUI users
# have: torch 2.14.1, torchaudio 2.11.1 installed --no-deps (it pins another torch), and the
# `qwen-tts` package with only the modules it imports (requirements/qwen3tts.txt, --no-deps:
# its declared dependencies pull gradio, accelerate and a transformers pin into ComfyUI).
#
#   tools/install.sh            # .venv: runtime + tests + Qwen3-TTS
#   tools/install.sh --core     # .venv-core: runtime + tests only (torch 2.13 CPU, no engine package)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ "${1:-}" = "--core" ]; then
  "$python" -m venv .venv-core
  .venv-core/bin/pip install -q -c constraints-core.txt -e '.[test]'
  exit 0
fi
"$python" -m venv .venv
.venv/bin/pip install -q -c constraints.txt torch
.venv/bin/pip install -q --no-deps -r requirements/qwen3tts.txt
.venv/bin/pip install -q -c constraints.txt -e '.[test]'
