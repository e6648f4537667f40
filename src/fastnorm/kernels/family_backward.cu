// CUDA entry points of the family's backward (family_binding.cpp's family_backward calls them): workspace
// size and launch, dispatched on the input dtype. The kernels are in family_backward.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "family_backward.cuh"
#include "kernel_set.h"

namespace {

template <typename T>
int64_t backward_workspace(const FamilyBackwardParams& p) {
  using namespace fastnorm::family::backward;
  return workspace_bytes<typename fastnorm::AccOf<T>::type>(plan_of<T>(p));
}

}  // namespace

int64_t fastnorm_cuda_family_backward_workspace_bytes(const FamilyBackwardParams& p) {
  if (p.n * p.channels * p.spatial == 0) return 0;
  switch (p.dtype) {
    case FN_F32: return backward_workspace<float>(p);
    case FN_F64: return backward_workspace<double>(p);
    case FN_F16: return backward_workspace<__half>(p);
    case FN_BF16: return backward_workspace<__nv_bfloat16>(p);
    default: return 0;
  }
}

const char* fastnorm_cuda_family_backward(const FamilyBackwardParams& p, void* stream) {
  using namespace fastnorm::family::backward;
  if (p.n * p.channels * p.spatial == 0) return nullptr;
  if (!p.x || !p.dy || !p.mean || !p.var || p.channels <= 0 || p.groups <= 0 || p.channels % p.groups != 0 ||
      (p.mode != FN_BWD_GROUPS && p.mode != FN_BWD_BATCH && p.mode != FN_BWD_GIVEN)) {
    return "fastnorm_cuda_family_backward: inconsistent parameters";
  }
  if (p.activation != FN_ACT_NONE && p.activation != FN_ACT_SILU) {
    return "fastnorm_cuda_family_backward: unknown activation";
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
#ifdef FASTNORM_WANT_F32
    case FN_F32: return run_backward<float>(p, s);
#endif
#ifdef FASTNORM_WANT_F64
    case FN_F64: return run_backward<double>(p, s);
#endif
#ifdef FASTNORM_WANT_F16
    case FN_F16: return run_backward<__half>(p, s);
#endif
#ifdef FASTNORM_WANT_BF16
    case FN_BF16: return run_backward<__nv_bfloat16>(p, s);
#endif
    default: return fastnorm_dtype_not_built(p.dtype, "fastnorm_cuda_family_backward: unsupported dtype");
  }
}
