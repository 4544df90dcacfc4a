#!/usr/bin/env bash
# On a machine with a CUDA GPU: training-step speed of GPT-2 124M and SmolLM2-135M against
# transformers and litgpt, each under torch.compile, at batch 16 × 1024, bf16 autocast, fused
# AdamW, vocabulary padded to a multiple of 64, with MFU and peak memory; decoding as the
# context grows, a static cache under torch.compile among them; then the CUDA tests.
# Logs under $1. litgpt runs under $LITGPT_PYTHON (bench/setup_peers.sh makes one).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # cardc without an install, as on a bare GPU machine
out=${1:-cuda-results}
rounds=${ROUNDS:-2}
litgpt=${LITGPT_PYTHON:-bench/.venv-litgpt/bin/python}
mkdir -p "$out"
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())' | tee "$out/device.log"
for model in gpt2 llama; do
    python3 bench/train_step.py --model $model --config full --device cuda --compile \
        --batch 16 --block 1024 --rounds "$rounds" --steps 20 --warmup 5 \
        --peers transformers litgpt --litgpt-python "$litgpt" --json "$out/train_step_$model.json" \
        2>&1 | tee -a "$out/train_step.log"
done
# decoding as the context grows: the growing cache, the static one compiled, transformers' two
python3 bench/long_context.py --device cuda --compile --contexts 256 1024 4096 --tokens 64 \
    --rounds 3 2>&1 | tee "$out/long_context.log"
python3 -m pytest -q -s -p no:cacheprovider -n 0 tests/test_cuda.py 2>&1 | tee "$out/tests.log"
