// Entry points of the CUDA forward, called by binding.cpp: the workspace a call needs, and the call,
// dispatched to the translation unit of its dtype pair.
#include <algorithm>

#include "instances.h"
#include "planner.cuh"

int64_t fastnorm_cuda_workspace_bytes(const NormParams& p) {
  using namespace fastnorm;
  if (p.inner != 1 || p.outer == 0 || p.n == 0) return 0;
  const Device dev = device_info();
  // The resident kernel's, and enough for the kernels taking the call if it does not launch.
  const int64_t resident = resident_groups(p, dev, row_vec(p)) > 0 ? grid_rows_workspace(dev.sms) : 0;
  if (streamed_rows(p, dev.sms)) {
    const int64_t streamed = p.outer * stream_chunks(p, row_vec(p)) * int64_t(sizeof(Stats<double>)) +
                             p.outer * int64_t(sizeof(Affine<double>));
    return std::max(streamed, resident);
  }
  if (!dev.coop || wanted_blocks_per_row(p, dev.sms) <= 1 || cluster_plan(p, dev, row_vec(p)) > 0) return resident;
  // Bound for any split plan: every resident block may own a slot (a 16-byte counter) and writes
  // two partial statistics (double-buffered).
  const int64_t max_blocks = int64_t(dev.sms) * (2048 / split_threads(p) + 1);
  return std::max(resident, max_blocks * 16 + 2 * max_blocks * int64_t(sizeof(Stats<double>)));
}

const char* fastnorm_cuda_forward(const NormParams& p, void* stream_ptr) {
  using namespace fastnorm;
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool own = p.wdtype == FN_NONE || p.wdtype == p.dtype, f32 = p.wdtype == FN_F32;
  switch (p.dtype) {
    case FN_F32: return own ? forward_f32(p, stream) : "weight dtype must match the input or be float32";
    case FN_F16: return own ? forward_f16(p, stream) : f32 ? forward_f16_wf32(p, stream) : "weight dtype must match the input or be float32";
    case FN_BF16: return own ? forward_bf16(p, stream) : f32 ? forward_bf16_wf32(p, stream) : "weight dtype must match the input or be float32";
    case FN_F64: return own ? forward_f64(p, stream) : "float64 input needs float64 weight";
    default: return "unsupported dtype";
  }
}
