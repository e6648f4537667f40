// Forward kernels for __nv_bfloat16 input, __nv_bfloat16 weight and bias (see planner.cuh).
#include "instances.h"
#include "planner.cuh"

FASTNORM_FORWARD_INSTANCE(forward_bf16, __nv_bfloat16, __nv_bfloat16)
