// Forward kernels for double input, double weight and bias (see planner.cuh).
#include "instances.h"
#include "planner.cuh"

FASTNORM_FORWARD_INSTANCE(forward_f64, double, double)
