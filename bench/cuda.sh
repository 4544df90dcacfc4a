#!/usr/bin/env bash
# On a machine with a CUDA GPU: the CUDA tests, then training-step speed against transformers
# at two real sizes (GPT-2 124M, SmolLM2-135M), bf16 autocast, with MFU. Results under $1.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-cuda-results}
mkdir -p "$out"
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'
python3 -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$out/tests.log"
for card in "cards/gpt2.card --preset gpt2" "cards/llama.card --preset smollm2-135m"; do
    # shellcheck disable=SC2086
    python3 bench/train_step.py --card $card --device cuda --batch 8 --block 512 --rounds 3 \
        --steps 10 --peers transformers 2>&1 | tee -a "$out/train_step.log"
done
