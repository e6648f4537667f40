// Forward kernels for __nv_bfloat16 input, float weight and bias (see planner.cuh).
#include "instances.h"
#include "planner.cuh"

FASTNORM_FORWARD_INSTANCE(forward_bf16_wf32, __nv_bfloat16, float)
