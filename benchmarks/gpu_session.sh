#!/usr/bin/env bash
# One device call: install, build (timed), GPU tests, sanitizer (devtool.py sanitize), timings (devtool.py
# time), sweeps. Stages: build tests sanitize time (default: all), and sweep-bf16 / sweep-fp16 / sweep-fp32 (the
# sweep of that dtype against the committed results/$PREFIX-sweep-<dtype>.json, PREFIX default h200; a sweep takes
# 130-190 s on an H200 with compile's first calls: at most two a device call). Logs go to $OUT when set. Run from
# the repository root; TESTS and TIMING_ARGS override the test files and the timing arguments.
set -uo pipefail
OUT=${OUT:-/tmp/fastnorm_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/fastnorm_ext}
stages=${*:-build tests sanitize time}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -v WARNING
# Wheels carried in .whl/ (Liger for the sweeps' column: the GPU machine reaches no registry).
for wheel in .whl/*.whl; do [ -f "$wheel" ] && python3 -m pip install -q --no-build-isolation --no-deps "$wheel" 2>&1 | grep -v WARNING; done
for stage in $stages; do
  echo "=== $stage"
  case $stage in
    build)
      python3 -c "import time,fastnorm.ops.extension as e; t=time.time(); e.load('cuda'); print(f'first build {time.time()-t:.1f} s')" 2>&1 | tee "$OUT/build.log"
      python3 -c "import time; t=time.time(); import fastnorm.ops.extension as e; e.load('cuda'); print(f'cached load {time.time()-t:.2f} s')" ;;
    tests) timeout 420 python3 -m pytest -q --maxfail=10 -p no:cacheprovider ${TESTS:-tests/test_cuda_norm.py} 2>&1 | tee "$OUT/tests.log" | tail -40 ;;
    sanitize)
      timeout 240 compute-sanitizer --tool memcheck --print-limit 5 python3 benchmarks/devtool.py sanitize 2>&1 | tail -5
      timeout 240 compute-sanitizer --tool racecheck --print-limit 5 python3 benchmarks/devtool.py sanitize 2>&1 | tail -5 ;;
    time) timeout 400 python3 benchmarks/devtool.py time ${TIMING_ARGS:---no-compile} 2>&1 | tee "$OUT/timing.log" ;;
    sweep-*)
      d=${stage#sweep-}; name=${PREFIX:-h200}-sweep-$d; base=benchmarks/results/$name.json
      timeout 250 fastnorm bench --suite sweep --dtype "$d" --json "$OUT/$name.json" --chart "$OUT/$name.png" \
        $([ -f "$base" ] && echo --baseline "$base") > "$OUT/$name.log" 2>&1
      echo "rc=$?"; grep -E "^baseline|slower|flagged" "$OUT/$name.log" ;;
  esac
done
