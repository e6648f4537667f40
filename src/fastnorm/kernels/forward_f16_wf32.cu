// Forward kernels for __half input, float weight and bias (see planner.cuh).
#include "instances.h"
#include "planner.cuh"

FASTNORM_FORWARD_INSTANCE(forward_f16_wf32, __half, float)
