#!/usr/bin/env bash
# The simulator's accuracy on this machine (issue 24): calibrate on one run of the demo job, then
# measure and predict (a) the multi-turn ShareGPT workload, (b) the single-turn one at another
# max_num_seqs, (c) static batching, each on the same requests and output lengths (the simulated
# runs replay the measured runs' outputs). Prints predicted / measured per case and the
# continuous / static ratio both ways.
#
# usage: bash jobs/sim/accuracy.sh [WORK_DIR]      (activate the venv first; about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/../.."
work=${1:-/tmp/batchgen-sim-accuracy}
mkdir -p "$work"
common=(--num-prompts 64 --max-tokens 64 --max-num-batched-tokens 1024 --quiet)

if [ ! -d jobs/data/sharegpt ]; then
    batchgen prepare-sharegpt jobs/data/sharegpt --rows 128 --shards 4
fi
batchgen run jobs/demo.yaml --restart --quiet --set "output.path=$work/demo"
batchgen simulate --calibrate "$work/demo" --out "$work/here.yaml" --name here

run_case() {  # name, then bench options; measured run first, then its simulation
    local name=$1
    shift
    batchgen bench "${common[@]}" "$@" --requests-out "$work/$name.req.jsonl" \
        --outputs-out "$work/$name.out.jsonl" --out "$work/$name.json"
    batchgen bench "${common[@]}" "$@" --requests-in "$work/$name.req.jsonl" \
        --outputs-in "$work/$name.out.jsonl" --simulate "$work/here.yaml" --out "$work/$name.sim.json"
}
run_case multi-turn --workload multi-turn --max-num-seqs 32
run_case single-turn-8 --workload single-turn --max-num-seqs 8
run_case single-turn-32 --workload single-turn --max-num-seqs 32
run_case static-32 --workload single-turn --max-num-seqs 32 --batching static

python - "$work" <<'EOF'
import json
import sys
from pathlib import Path

work = Path(sys.argv[1])
wall = {}
print(f"{'case':<16}{'measured s':>11}{'predicted s':>12}{'error':>8}")
for name in ("multi-turn", "single-turn-8", "single-turn-32", "static-32"):
    measured = json.loads((work / f"{name}.json").read_text())["results"][0]["wall_s"]
    predicted = json.loads((work / f"{name}.sim.json").read_text())["results"][0]["wall_s"]
    wall[name] = (measured, predicted)
    print(f"{name:<16}{measured:>11.2f}{predicted:>12.2f}{predicted / measured - 1:>+8.1%}")
(m_c, p_c), (m_s, p_s) = wall["single-turn-32"], wall["static-32"]
print(f"continuous/static speed-up: measured {m_s / m_c:.3f}x, predicted {p_s / p_c:.3f}x "
      f"({(p_s / p_c) / (m_s / m_c) - 1:+.1%})")
EOF
