// Forward kernels for float input, float weight and bias (see planner.cuh).
#include "instances.h"
#include "planner.cuh"

FASTNORM_FORWARD_INSTANCE(forward_f32, float, float)
