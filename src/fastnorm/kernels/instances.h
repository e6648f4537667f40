// The forward and backward of each (input dtype, weight/bias dtype) pair, defined in forward_<pair>.cu and
// backward_<pair>.cu: one translation unit each, so that ninja compiles them in parallel.
#pragma once
#include <cuda_runtime.h>

#include "norm_backward_params.h"
#include "norm_params.h"

namespace fastnorm {
const char* forward_f32(const NormParams& p, cudaStream_t stream);       // parameters float32 or none
const char* forward_f64(const NormParams& p, cudaStream_t stream);       // parameters float64 or none
const char* forward_f16(const NormParams& p, cudaStream_t stream);       // parameters float16 or none
const char* forward_f16_wf32(const NormParams& p, cudaStream_t stream);  // parameters float32
const char* forward_bf16(const NormParams& p, cudaStream_t stream);      // parameters bfloat16 or none
const char* forward_bf16_wf32(const NormParams& p, cudaStream_t stream); // parameters float32
// With workspace_bytes set, a backward only says how much scratch the call needs.
const char* backward_f32(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes);
const char* backward_f64(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes);
const char* backward_f16(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes);
const char* backward_f16_wf32(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes);
const char* backward_bf16(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes);
const char* backward_bf16_wf32(const NormBackwardParams& p, cudaStream_t stream, int64_t* workspace_bytes);
}  // namespace fastnorm
