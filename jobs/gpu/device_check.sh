#!/usr/bin/env bash
# The GPU check as one device-tool call; runs on the GPU machine from the repository root, with
# the folder `.gpucheck` carried (written here by `python jobs/gpu/gpu_job.py prepare`).
#
#   device run:  command "bash jobs/gpu/device_check.sh"  carry [".gpucheck"]  timeout_s 330
#   a second try, later stages only:  "bash jobs/gpu/device_check.sh --stages engine,bench,attention"
#
# Figures land in $OUT: gpu_check.json (rewritten after every stage), gpu_check.log (this
# output), pytest_kernels.log, engine_bench.json, bench_{continuous,static}.json with their
# .timeline.parquet (for `batchgen simulate --calibrate`). The check stops itself before timeout_s:
# stages get GPU_CHECK_BUDGET_S seconds (270), and a hard `timeout` ends the command at 300 s.
set -uo pipefail
: "${OUT:?OUT must name the folder whose files come back (the device tool sets it)}"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset TRITON_INTERPRET
budget_s=${GPU_CHECK_BUDGET_S:-270}
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv 2>&1 | head -3
timeout -k 10 $((budget_s + 30)) python3 -m batchgen gpu-check \
    --out "$OUT" \
    --model .gpucheck/model \
    --requests .gpucheck/requests.jsonl \
    --work-dir /tmp/batchgen-gpu-check \
    --budget-s "$budget_s" \
    --kernel-tests-timeout-s 120 \
    --num-prompts 128 \
    "$@" 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "gpu-check exit code: $rc (124: the hard timeout ended it; gpu_check.json holds every stage that finished)"
ls -l "$OUT"
exit "$rc"
