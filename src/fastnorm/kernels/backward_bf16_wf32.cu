// Backward kernels for __nv_bfloat16 input, float weight and bias (see backward_planner.cuh).
#include "backward_planner.cuh"
#include "instances.h"

FASTNORM_BACKWARD_INSTANCE(backward_bf16_wf32, __nv_bfloat16, float)
