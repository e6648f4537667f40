// Backward kernels for float input, float weight and bias (see backward_planner.cuh).
#include "backward_planner.cuh"
#include "instances.h"

FASTNORM_BACKWARD_INSTANCE(backward_f32, float, float)
