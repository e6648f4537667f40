#!/usr/bin/env bash
# The GPU check to run before calling any device work done (issue 29), in one device call:
#   build       install, first build of the CUDA extension (timed), cached load
#   tests       every CUDA-marked test (MARK overrides the marker expression, e.g. MARK="cuda and not slow")
#   The same tests in parts that each fit a 10-minute device call (H100, session 23: seconds, a cold machine):
#   quick       "cuda and not slow" but tests/test_harness_gpu.py (1815 tests, 165 s after a 30-50 s build)
#   harness     tests/test_harness_gpu.py but its hundred candidates (not yet timed whole: its six tests past
#               the two seed tests took 202 s; the seed tests add nvcc builds of four candidates)
#   slow        the slow CUDA tests but the hundred candidates (the one-GPU pool 177 s, test_solve_cuda 216 s,
#               the norm tests 5 s, in separate calls)
#   hundred     test_a_hundred_candidates_leak_nothing alone (448 s)
#   sanitize    compute-sanitizer memcheck and racecheck over every kernel family (benchmarks/devtool.py sanitize)
#   steadiness  fastnorm eval of the seed solutions (PROBLEMS) RUNS times in a row against an in-process
#               CUDA-event median
#   scale       benchmarks/eval_scale.py: COPIES candidates one at a time against builds run ahead, on one GPU
# Usage (repository root, GPU machine): bash benchmarks/gpu_check.sh [STAGE ...]   (default: all, in this order;
# on the device tool, one call each: "build quick", "sanitize", "harness", "slow", "hundred", "steadiness", "scale")
# Logs and JSON go to $OUT/gpu_check (the device runner's output folder; /tmp/fastnorm_out without one). The
# last lines of every log are echoed, and the exit status is that of the first stage that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/fastnorm_out}
logs=$OUT/gpu_check
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/fastnorm_ext}
export FASTNORM_COMMIT=${FASTNORM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
stages=${*:-build tests sanitize steadiness scale}
status=0
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$logs/gpu.txt"
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -v WARNING

run() {  # run NAME SECONDS COMMAND...: the command's output in $logs/NAME.log, its tail echoed
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc in $((SECONDS - start)) s"
  tail -n "${TAIL:-8}" "$logs/$name.log"
  [ "$rc" -ne 0 ] && [ "$status" -eq 0 ] && status=$rc
  return 0
}

for stage in $stages; do
  case $stage in
    build)
      run build 300 python3 -c "import time, fastnorm.ops.extension as e; t = time.time(); e.load('cuda'); print(f'first build {time.time() - t:.1f} s')"
      run cached_load 60 python3 -c "import time; t = time.time(); import fastnorm.ops.extension as e; e.load('cuda'); print(f'cached load {time.time() - t:.2f} s')" ;;
    tests)
      run tests "${TESTS_LIMIT:-900}" python3 -m pytest -q -p no:cacheprovider -m "${MARK:-cuda}" ${TESTS:-tests} ;;
    quick)
      run quick 500 python3 -m pytest -q -p no:cacheprovider -m "cuda and not slow" tests --ignore=tests/test_harness_gpu.py ;;
    harness)
      run harness 560 python3 -m pytest -q -p no:cacheprovider -m "cuda and not slow" tests/test_harness_gpu.py ;;
    slow)
      run slow 560 python3 -m pytest -q -p no:cacheprovider -m "cuda and slow" tests -k "not hundred_candidates" ;;
    hundred)
      run hundred 590 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_harness_gpu.py -k hundred_candidates ;;
    sanitize)
      run memcheck 300 compute-sanitizer --tool memcheck --print-limit 5 --error-exitcode 1 python3 benchmarks/devtool.py sanitize
      # racecheck a section at a time: over all of them in one process it ended without a report (session 20)
      for section in rows long_rows offset_rows channels family backward residual loss; do
        run "racecheck_$section" 300 compute-sanitizer --tool racecheck --print-limit 5 --error-exitcode 1 \
          python3 benchmarks/devtool.py sanitize --sections "$section"
      done ;;
    steadiness)
      for problem in ${PROBLEMS:-layer_norm_16x64x256x256 rms_norm_112x64x512x512}; do
        run "steadiness_$problem" 600 python3 benchmarks/eval_steadiness.py "problems/$problem.py" "solutions/$problem.py" \
          --runs "${RUNS:-5}" --json "$logs/steadiness_$problem.json"
      done ;;
    scale)
      # A load_inline candidate (the solver's single file builds at import, which the pool can do ahead);
      # solutions/*.py import fastnorm, whose one build all judges share.
      run solve_for_scale 300 fastnorm solve problems/layer_norm_16x64x256x256.py -o "$logs/ln_solved.py"
      run eval_scale 900 python3 benchmarks/eval_scale.py problems/layer_norm_16x64x256x256.py \
        "$logs/ln_solved.py" --copies "${COPIES:-16}" --configs sequential one_gpu_builds_ahead \
        --out "$logs/eval_scale.json" ;;
    *) echo "unknown stage $stage (build tests quick harness slow hundred sanitize steadiness scale)"; status=2 ;;
  esac
done
exit "$status"
