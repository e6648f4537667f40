// Forward kernels for __half input, __half weight and bias (see planner.cuh).
#include "instances.h"
#include "planner.cuh"

FASTNORM_FORWARD_INSTANCE(forward_f16, __half, __half)
