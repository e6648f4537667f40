// Backward kernels for __nv_bfloat16 input, __nv_bfloat16 weight and bias (see backward_planner.cuh).
#include "backward_planner.cuh"
#include "instances.h"

FASTNORM_BACKWARD_INSTANCE(backward_bf16, __nv_bfloat16, __nv_bfloat16)
