#!/usr/bin/env bash
# The peers' own environments for bench/train_step.py. transformers lives in the project's
# .venv (the `test` extra); litgpt pins huggingface-hub<1.4, which current transformers
# refuses, so it gets bench/.venv-litgpt, with the same torch.
set -euo pipefail
cd "$(dirname "$0")"
TORCH=${TORCH:-torch==2.13.0}
if [ ! -x .venv-litgpt/bin/python ]; then
    python3 -m venv .venv-litgpt
fi
.venv-litgpt/bin/pip install -q "$TORCH" litgpt
.venv-litgpt/bin/python -c "import importlib.metadata as m; print('litgpt', m.version('litgpt'), 'torch', m.version('torch'))"
