// Backward kernels for __half input, __half weight and bias (see backward_planner.cuh).
#include "backward_planner.cuh"
#include "instances.h"

FASTNORM_BACKWARD_INSTANCE(backward_f16, __half, __half)
