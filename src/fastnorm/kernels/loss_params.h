// Plain description of one softmax cross-entropy call (loss_binding.cpp -> softmax_loss.cu), free of
// PyTorch headers like norm_params.h.
//
// logits: rows x classes, element (r, c) at logits[r * row_stride + c]. target: rows int64 class indices;
// a row whose target is ignore_index has loss 0 and gradient 0; any other target outside [0, classes)
// gives the row a NaN loss (a device assert would take the caller's process down).
// Forward: loss[r] = lse[r] - logits[r, target[r]], lse[r] = log(sum_c exp(logits[r, c])), both in the
// accumulator type (float64 for float64 logits, else float32).
// Backward: dlogits[r, c] = dloss[r] * (exp(logits[r, c] - lse[r]) - (c == target[r])), contiguous,
// in the logits' dtype; dloss (rows, accumulator type) is the gradient of loss.
#pragma once
#include <stdint.h>

#include "norm_params.h"  // FastnormDtype

struct CrossEntropyParams {
  const void* logits;
  int64_t rows;
  int64_t classes;
  int64_t row_stride;  // elements between the starts of consecutive rows of logits
  const int64_t* target;
  int64_t ignore_index;
  int dtype;  // FastnormDtype of logits (and dlogits)
  // forward
  void* loss;
  void* lse;
  // backward (lse as above, read)
  const void* dloss;
  void* dlogits;
};
