// Backward kernels for double input, double weight and bias (see backward_planner.cuh).
#include "backward_planner.cuh"
#include "instances.h"

FASTNORM_BACKWARD_INSTANCE(backward_f64, double, double)
