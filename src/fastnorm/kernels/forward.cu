// Entry points of the CUDA forward, called by binding.cpp: the workspace a call needs, and the call,
// dispatched to the translation unit of its dtype pair.
#include <algorithm>

#include "instances.h"
#include "kernel_set.h"
#include "planner.cuh"

// Weight and bias of another dtype than the input's: float32 ones for the half types only.
constexpr const char* kMixedWeights = "weight dtype must match the input or be float32";

// *zeroed: whether the kernels need it zeroed (the split and resident kernels' arrival counters).
int64_t fastnorm_cuda_workspace_bytes(const NormParams& p, bool* zeroed) {
  using namespace fastnorm;
  *zeroed = true;
  if (p.inner != 1 || p.outer == 0 || p.n == 0) return 0;
  const Device dev = device_info();
#ifdef FASTNORM_WANT_HELD_ROWS
  {
    const int64_t chunks = held_rows_chunks(p, dev, row_vec(p));
    if (chunks > 0) {
      *zeroed = false;  // the launcher clears the chain's counters itself
      return held_rows_workspace_bytes(p.outer, chunks, 4);  // float accumulators: no float64 rows
    }
  }
#endif
  // The resident kernel's, and enough for the kernels taking the call if it does not launch.
  int64_t bytes = 0;
#ifdef FASTNORM_WANT_RESIDENT
  if (resident_groups(p, dev, row_vec(p)) > 0) bytes = grid_rows_workspace(dev.sms);
#endif
#ifdef FASTNORM_WANT_STREAMED
  if (streamed_rows(p, dev.sms)) {
    const int64_t streamed = stream_workspace_bytes(p, row_vec(p), dev.sms, int(sizeof(double)));
    *zeroed = bytes > 0;  // the resident kernel's counters, where it may take the call instead
    return std::max(streamed, bytes);
  }
#endif
#if defined(FASTNORM_WANT_SPLIT) || defined(FASTNORM_WANT_SPLIT_UNCACHED)
  bool split = dev.coop && wanted_blocks_per_row(p, dev.sms) > 1;
#ifdef FASTNORM_WANT_CLUSTER
  split = split && cluster_plan(p, dev, row_vec(p)) == 0;
#endif
  if (split) {
    // Bound for any split plan: every resident block may own a slot (a 16-byte counter) and writes
    // two partial statistics (double-buffered).
    const int64_t max_blocks = int64_t(dev.sms) * (2048 / split_threads(p) + 1);
    bytes = std::max(bytes, max_blocks * 16 + 2 * max_blocks * int64_t(sizeof(Stats<double>)));
  }
#endif
  return bytes;
}

// Whether a forward of this call can save its rows' statistics for the backward (NormParams::stats).
bool fastnorm_cuda_saves_stats(const NormParams& p) {
  return p.outer > 0 && p.n > 0 && fastnorm::row_stats_saved(p);
}

const char* fastnorm_cuda_forward(const NormParams& p, void* stream_ptr) {
  using namespace fastnorm;
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool own = p.wdtype == FN_NONE || p.wdtype == p.dtype;
  [[maybe_unused]] const bool wf32 = p.wdtype == FN_F32;  // read by the half types' cases only
  switch (p.dtype) {
#ifdef FASTNORM_WANT_F32
    case FN_F32: return own ? forward_f32(p, stream) : kMixedWeights;
#endif
#ifdef FASTNORM_WANT_F16
    case FN_F16: return own ? forward_f16(p, stream) : wf32 ? forward_f16_wf32(p, stream) : kMixedWeights;
#endif
#ifdef FASTNORM_WANT_BF16
    case FN_BF16: return own ? forward_bf16(p, stream) : wf32 ? forward_bf16_wf32(p, stream) : kMixedWeights;
#endif
#ifdef FASTNORM_WANT_F64
    case FN_F64: return own ? forward_f64(p, stream) : "float64 input needs float64 weight";
#endif
    default: return fastnorm_dtype_not_built(p.dtype, "unsupported dtype");
  }
}
