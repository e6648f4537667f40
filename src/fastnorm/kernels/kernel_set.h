// What a build compiles: every input dtype and every LayerNorm / RMSNorm kernel family (kernel_wants.h), unless
// FASTNORM_SELECTED_KERNELS says the FASTNORM_WANT_* macros were chosen for it. The package's own
// build takes this default. A single-file solution (`fastnorm solve`) holds only what its traced calls
// need: the solver resolves these guards in the text itself (kernels/conditionals.py), so the code it
// leaves out is not in the file at all. Code a guard leaves out answers FASTNORM_NOT_BUILT.
#pragma once
#include "kernel_wants.h"
#include "norm_params.h"  // FastnormDtype

// What a call answers when its dtype or kernel family was left out of the build (the solver looks for
// "not in this build" to widen its selection).
#define FASTNORM_NOT_BUILT                                                                   \
  "kernels for this call are not in this build (a fastnorm solve solution holds only those of " \
  "its traced dtypes and shapes)"

// The answer of a dtype dispatch for a dtype it has no case for.
static inline const char* fastnorm_dtype_not_built(int dtype, const char* unsupported) {
  const bool known = dtype == FN_F32 || dtype == FN_F16 || dtype == FN_BF16 || dtype == FN_F64;
  return known ? FASTNORM_NOT_BUILT : unsupported;
}
