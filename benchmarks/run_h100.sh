#!/usr/bin/env bash
# The command that produces the committed H100 results: the full default suite (seed problems in fp32
# and bf16, last-dim shapes, latency rows) against PyTorch eager and torch.compile.
# Run from anywhere on the GPU machine; extra arguments go to `fastnorm bench` (e.g. --quick).
# When $OUT is set (the device runner's output folder), the JSON, PNG and log are copied there too.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
results=benchmarks/results
mkdir -p "$results"
status=0
python -m fastnorm bench --json "$results/h100.json" --chart "$results/h100.png" "$@" 2>&1 \
    | tee "$results/h100.txt" || status=$?
if [ -n "${OUT:-}" ]; then  # copy whatever was written, also when a row FAILED its check
    mkdir -p "$OUT/results"
    cp "$results"/h100.* "$OUT/results/" 2>/dev/null || true
fi
exit "$status"
