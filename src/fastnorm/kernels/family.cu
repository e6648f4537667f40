// CUDA entry points of the normalization family (family_binding.cpp calls them): workspace size and
// launch, dispatched on the input dtype. The kernels are in family_kernels.cuh, family_set_kernels.cuh and
// family_chain_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_set.h"
#include "family_chain_kernel.cuh"

namespace {

// f(T()) for the input dtype's T where this build holds it, else `otherwise`: the entries' one dispatch.
template <typename F>
const char* by_dtype(int dtype, const char* otherwise, F f) {
  switch (dtype) {
#ifdef FASTNORM_WANT_F32
    case FN_F32: return f(float());
#endif
#ifdef FASTNORM_WANT_F64
    case FN_F64: return f(double());
#endif
#ifdef FASTNORM_WANT_F16
    case FN_F16: return f(__half());
#endif
#ifdef FASTNORM_WANT_BF16
    case FN_BF16: return f(__nv_bfloat16());
#endif
    default: return otherwise;
  }
}

// Sets of statistics small enough for L2 in one kernel (family_set_kernels.cuh), the rest in the multi-kernel
// path; a single file holds only the paths its traced calls take (kernel_set.h's family path guards).
template <typename T>
const char* run_family_dtype(const FamilyParams& p, cudaStream_t stream) {
  using namespace fastnorm::family;
#ifdef FASTNORM_WANT_FAMILY_SETS
  const sets::SetPlan sp = sets::set_forward_plan<T>(p);
  if (sp.sets > 0) return sets::run_set_forward<T>(p, sp, stream);
#endif
#ifdef FASTNORM_WANT_FAMILY_PASSES
  return run_passes_stat<T>(p, stream);
#else
  return FASTNORM_NOT_BUILT;
#endif
}

template <typename T>
const char* p_norm_rows_dtype(const FamilyParams& p, cudaStream_t stream, bool* ran) {
  *ran = fastnorm::family::sets::p_norm_rows_take<T>(p);
  return *ran ? fastnorm::family::sets::run_p_norm_rows<T>(p, stream) : nullptr;
}

#if defined(FASTNORM_WANT_GROUP_CHAIN) || defined(FASTNORM_WANT_GROUP_HELD)
template <typename T>
const char* group_chain_dtype(const FamilyParams& p, cudaStream_t stream, int64_t* bytes) {
  using namespace fastnorm::family::chain;
  const ChainPlan cp = chain_plan<T>(p);
  *bytes = cp.sets > 0 ? chain_workspace_bytes(cp, sizeof(typename fastnorm::AccOf<T>::type)) : 0;
  return *bytes > 0 && p.workspace ? run_chain<T>(p, cp, stream) : nullptr;
}
#endif

}  // namespace

// GroupNorm sets of 256 KB to 16 MB in one kernel that reads x mostly once (family_chain_kernel.cuh); an
// entry of its own, which single-file solutions (they leave the kernel out: selection.py) hold as this stub
// in GroupNorm's files only. Without p.workspace it only sets *bytes, the workspace the call needs (0: the
// call is fastnorm_cuda_family's); with it, it launches.
const char* fastnorm_cuda_group_chain(const FamilyParams& p, void* stream, int64_t* bytes) {
  *bytes = 0;
#if defined(FASTNORM_WANT_GROUP_CHAIN) || defined(FASTNORM_WANT_GROUP_HELD)
  if (p.numel == 0 || !p.x || !p.y || !p.mean || p.groups <= 0 || p.channels % p.groups != 0) return nullptr;
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(p.dtype, nullptr, [&](auto t) { return group_chain_dtype<decltype(t)>(p, s, bytes); });
#else
  return nullptr;
#endif
}

// L1 / L2 rows that fit L2 in one kernel (p_norm_row_kernel); *ran false: the call is fastnorm_cuda_family's.
// An entry of its own, so that only p_normalize's single-file solutions carry the kernel.
const char* fastnorm_cuda_p_norm_rows(const FamilyParams& p, void* stream, bool* ran) {
  *ran = false;
  if (p.numel == 0 || !p.x || !p.y || !p.mean || p.stat == FN_STAT_MEAN_VAR || p.runs != 1) return nullptr;
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(p.dtype, nullptr, [&](auto t) { return p_norm_rows_dtype<decltype(t)>(p, s, ran); });
}

int64_t fastnorm_cuda_family_workspace_bytes(const FamilyParams& p) {
  if (p.numel == 0) return 0;
  const fastnorm::family::Plan pl = fastnorm::family::plan_of(p);
  return p.dtype == FN_F64 ? fastnorm::family::workspace_bytes<double>(p, pl)
                           : fastnorm::family::workspace_bytes<float>(p, pl);
}

const char* fastnorm_cuda_family(const FamilyParams& p, void* stream) {
  using namespace fastnorm::family;
  if (p.numel == 0) return nullptr;
  if (!p.x || !p.y || (!p.given_stats && !p.mean) || p.row_len <= 0 || p.run_len <= 0 || p.channels <= 0 ||
      p.groups <= 0 || p.channels % p.groups != 0 || p.numel % p.row_len != 0) {
    return "fastnorm_cuda_family: inconsistent parameters";
  }
  if (p.activation != FN_ACT_NONE && p.activation != FN_ACT_SILU) return "fastnorm_cuda_family: unknown activation";
  const auto s = static_cast<cudaStream_t>(stream);
  return by_dtype(p.dtype, fastnorm_dtype_not_built(p.dtype, "fastnorm_cuda_family: unsupported dtype"),
                  [&](auto t) { return run_family_dtype<decltype(t)>(p, s); });
}
