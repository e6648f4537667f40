// Entry points of the CUDA backward, called by binding.cpp: the workspace a call needs, and the call,
// dispatched to the translation unit of its dtype pair.
#include "instances.h"

namespace {

using Backward = const char* (*)(const NormBackwardParams&, cudaStream_t, int64_t*);

Backward backward_of(const NormBackwardParams& p) {
  using namespace fastnorm;
  const bool own = p.wdtype == FN_NONE || p.wdtype == p.dtype, f32 = p.wdtype == FN_F32;
  switch (p.dtype) {
    case FN_F32: return own ? backward_f32 : nullptr;
    case FN_F16: return own ? backward_f16 : f32 ? backward_f16_wf32 : nullptr;
    case FN_BF16: return own ? backward_bf16 : f32 ? backward_bf16_wf32 : nullptr;
    case FN_F64: return own ? backward_f64 : nullptr;
    default: return nullptr;
  }
}

}  // namespace

int64_t fastnorm_cuda_backward_workspace_bytes(const NormBackwardParams& p) {
  const Backward run = backward_of(p);
  if (run == nullptr || p.outer == 0 || p.n == 0 || p.inner == 0) return 0;
  int64_t bytes = 0;
  run(p, nullptr, &bytes);
  return bytes;
}

const char* fastnorm_cuda_backward(const NormBackwardParams& p, void* stream) {
  const Backward run = backward_of(p);
  if (run == nullptr) return "unsupported dtype pair (weight dtype must match the input or be float32)";
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  return run(p, static_cast<cudaStream_t>(stream), nullptr);
}
