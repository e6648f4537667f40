// Plain description of one softmax cross-entropy call (loss_binding.cpp -> softmax_loss.cu), free of
// PyTorch headers like norm_params.h.
//
// logits: rows x classes, element (r, c) at logits[r * row_stride + c]. target: rows int64 class indices;
// a row whose target is ignore_index has loss 0 and gradient 0; any other target outside [0, classes)
// gives the row a NaN loss (a device assert would take the caller's process down).
// Forward: loss[r] = lse[r] - logits[r, target[r]], lse[r] = log(sum_c exp(logits[r, c])), both in the
// accumulator type (float64 for float64 logits, else float32).
// With a reduction (FN_REDUCE_SUM / _MEAN), `out` gets sum_r loss[r] (divided by the rows not ignored for the
// mean) and `valid` that count, both one value of the accumulator type, summed in a fixed order.
// Backward: dlogits[r, c] = d[r] * (exp(logits[r, c] - lse[r]) - (c == target[r])), contiguous, in the
// logits' dtype, where d[r] is dloss[r] (no reduction), dloss[0] (sum) or dloss[0] / valid[0] (mean).
#pragma once
#include <stdint.h>

#include "norm_params.h"  // FastnormDtype

enum CrossEntropyReduction { FN_REDUCE_NONE = 0, FN_REDUCE_SUM = 1, FN_REDUCE_MEAN = 2 };
// Calls of up to this many rows reduce in the kernels' own launch (one block); longer ones in ATen's sums.
constexpr int64_t kCrossEntropyReduceRows = 32768;

struct CrossEntropyParams {
  const void* logits;
  int64_t rows;
  int64_t classes;
  int64_t row_stride;  // elements between the starts of consecutive rows of logits
  const int64_t* target;
  int64_t ignore_index;
  int dtype;      // FastnormDtype of logits (and dlogits)
  int reduction;  // CrossEntropyReduction
  // forward: loss and lse per row; with a reduction also out and valid
  void* loss;
  void* lse;
  void* out;
  void* valid;
  // backward (lse and valid as above, read)
  const void* dloss;
  void* dlogits;
};
