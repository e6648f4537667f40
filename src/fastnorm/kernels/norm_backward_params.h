// Plain description of one normalization backward call, shared by the CPU and CUDA kernels
// (PyTorch-free, like norm_params.h). The view is the forward's (outer, n, inner).
//
// Given x and the gradient dy of y = norm(x) [* w + b], the kernels write dx and, when asked,
// dweight / dbias. The row statistics (mean, rstd) are recomputed from x during the backward's own
// first read of it (no extra pass over memory), unless the CUDA forward saved them (`affine`). (The
// CPU kernels also take saved mean / rstd; the ops do not save any on the CPU.)
// x is at x[o * x_outer_stride + j * inner + i], dy at dy[o * dy_outer_stride + j * inner + i] (the
// CUDA kernels take dy_outer_stride == n * inner: the binding passes a contiguous dy); dx is contiguous.
#pragma once
#include <stdint.h>

#include "norm_params.h"  // FastnormDtype

struct NormBackwardParams {
  const void* x;
  const void* dy;
  const void* weight;  // n elements or null (then w = 1)
  void* dx;            // may be null when dx is not wanted
  const void* dx_add;  // null, or a tensor like dx added to it: the gradient a residual block's h
                       // gets from later layers (contiguous, x's dtype)
  void* dweight;       // n elements of the weight dtype, or null when not wanted
  void* dbias;         // n elements of the weight dtype, or null (always null for RMSNorm)
  // Saved statistics, one per (o, i) at index o * inner + i, float32 (float64 for float64 x), CPU
  // only; both null: recomputed (the ops always pass null). RMSNorm reads rstd only.
  const void* mean;
  const void* rstd;
  int64_t outer;
  int64_t n;
  int64_t inner;
  int64_t x_outer_stride;
  int64_t dy_outer_stride;
  int dtype;   // FastnormDtype of x, dy and dx
  int wdtype;  // FastnormDtype of weight, dweight and dbias (FN_NONE when none of them is given)
  int rms;
  double eps;
  // Scratch space (partial sums), size from the *_backward_workspace_bytes entry; need not be zeroed.
  void* workspace;
  int64_t workspace_bytes;
  // CUDA: the forward's saved affine maps (NormParams::stats), or null. The row backward then skips
  // the statistics and sums only g and g * xhat (RMSNorm: g * x); other paths recompute them.
  const void* affine;
};
