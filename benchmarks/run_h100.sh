#!/usr/bin/env bash
# The command that produces the committed H100 results: the full default suite (seed problems in fp32
# and bf16, last-dim shapes, latency rows) against PyTorch eager and torch.compile, once per timing
# mode: device time (h100.*, the default of `fastnorm bench`) and with host time counted (h100-host.*).
# Run from anywhere on the GPU machine; extra arguments go to `fastnorm bench` (e.g. --quick).
# When $OUT is set (the device runner's output folder), the JSON, PNG and logs are copied there too.
# The charts (h100.png, h100-rows.png, ...) need matplotlib; on a machine without it, draw them from the
# JSONs afterwards: fastnorm bench --chart-from benchmarks/results/h100.json --chart benchmarks/results/h100.png
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
results=benchmarks/results
mkdir -p "$results"
status=0
for mode in device host; do
  name=h100; [ "$mode" = host ] && name=h100-host
  python -m fastnorm bench --timing "$mode" --json "$results/$name.json" --chart "$results/$name.png" "$@" 2>&1 \
      | tee "$results/$name.txt" || status=$?
done
if [ -n "${OUT:-}" ]; then  # copy whatever was written, also when a row FAILED its check
  mkdir -p "$OUT/results"
  cp "$results"/h100*.json "$results"/h100*.png "$results"/h100*.txt "$OUT/results/" 2>/dev/null || true
fi
exit "$status"
