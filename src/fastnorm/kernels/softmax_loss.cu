// Softmax cross-entropy over the classes of each row: the log-softmax normalization of the row and the
// negative log-likelihood of its target class (fastnorm.cross_entropy; loss_params.h has the semantics).
// A group of threads a row (blockDim.x of them, threadIdx.y the row in the block: short rows share a block).
// The forward reads the row once, keeping a running max and sum of exponentials; the backward reads it
// again and writes the gradient. Rows at any 16-byte offset take 16-byte loads between
// a scalar head and tail that reach the boundaries. No float32 copy of the logits is ever written.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_vec.cuh"
#include "loss_params.h"

namespace fastnorm {
namespace loss {

constexpr int kMaxThreads = 256;
constexpr int kUnroll = 4;  // vectors a thread loads before it uses the first

__device__ __forceinline__ float exp_acc(float v) { return __expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }  // a NaN shows in the sum
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }

// exp(x - shift) stays finite with shift = max, except where the max is -inf (an empty or all -inf set):
// shifting by 0 there keeps the sums at 0 (or NaN where a NaN was seen) instead of exp(-inf + inf).
template <typename A>
__device__ __forceinline__ A shift_of(A m) {
  return m == -INFINITY ? A(0) : m;
}

// A running max m of values and their sum of exp(value - shift_of(m)).
template <typename A>
struct MaxSum {
  A m, s;
};

template <typename A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = max_acc(a.m, b.m), shift = shift_of(m);
  return {m, a.s * exp_acc(a.m - shift) + b.s * exp_acc(b.m - shift)};
}

// acc with K more values: one rescale of the running sum per batch, one exponential per value.
template <int K, typename A>
__device__ __forceinline__ MaxSum<A> add_values(MaxSum<A> acc, const A (&x)[K]) {
  A batch_max = x[0];
#pragma unroll
  for (int e = 1; e < K; ++e) batch_max = max_acc(batch_max, x[e]);
  const A m = max_acc(acc.m, batch_max), shift = shift_of(m);
  A s = acc.s * exp_acc(acc.m - shift);
#pragma unroll
  for (int e = 0; e < K; ++e) s += exp_acc(x[e] - shift);
  return {m, s};
}

// The merge over a row's threads (whole warps); every thread of the row gets it.
template <typename A>
__device__ __forceinline__ MaxSum<A> row_merge(MaxSum<A> acc) {
  __shared__ A ms[kMaxThreads / 32], ss[kMaxThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    acc = merge(acc, MaxSum<A>{__shfl_xor_sync(0xffffffffu, acc.m, offset),
                               __shfl_xor_sync(0xffffffffu, acc.s, offset)});
  }
  const int warps = blockDim.x / 32;
  if (warps == 1) return acc;
  const int first = threadIdx.y * warps, warp = first + threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) ms[warp] = acc.m, ss[warp] = acc.s;
  __syncthreads();
  acc = MaxSum<A>{-INFINITY, A(0)};
  for (int w = first; w < first + warps; ++w) acc = merge(acc, MaxSum<A>{ms[w], ss[w]});
  return acc;
}

// Elements of a row before its first 16-byte boundary.
template <typename T>
__device__ __forceinline__ int head_elements(const T* p) {
  const unsigned misaligned = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) & 15u);
  return misaligned == 0 ? 0 : static_cast<int>((16u - misaligned) / sizeof(T));
}

// f(vector, index) for the vectors t, t + threads, ... of body below `vecs`, kUnroll loads in flight.
template <typename V, typename F>
__device__ __forceinline__ void for_own_vectors(const V* body, int vecs, int t, int threads, F&& f) {
  int i = t;
  for (; i + (kUnroll - 1) * threads < vecs; i += kUnroll * threads) {
    V v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_vec<false>(body + i + u * threads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(v[u], i + u * threads);
  }
  for (; i < vecs; i += threads) f(load_vec<false>(body + i), i);
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) cross_entropy_forward_kernel(CrossEntropyParams p) {
  using A = typename AccOf<T>::type;
  constexpr int VEC = 16 / sizeof(T);
  using V = Vec<T, VEC>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool in_range = r < p.rows;  // a block's last rows may be past the end; they still meet its barrier
  const int n = in_range ? static_cast<int>(p.classes) : 0, t = threadIdx.x, threads = blockDim.x;
  const T* row = static_cast<const T*>(p.logits) + (in_range ? r : 0) * p.row_stride;
  const int head = min(head_elements(row), n), vecs = (n - head) / VEC, tail = head + vecs * VEC;
  MaxSum<A> acc{-INFINITY, A(0)};
  if (t < head) acc = add_values<1>(acc, {A(to_acc(row[t]))});
  if (tail + t < n) acc = add_values<1>(acc, {A(to_acc(row[tail + t]))});
  for_own_vectors(reinterpret_cast<const V*>(row + head), vecs, t, threads, [&](const V& v, int) {
    A x[VEC];
    widen(v.v, x);
    acc = add_values(acc, x);
  });
  acc = row_merge(acc);
  if (t == 0 && in_range) {
    const A lse = acc.m + log_acc(acc.s);
    const int64_t target = p.target[r];
    A loss = A(0);
    if (target != p.ignore_index) loss = target < 0 || target >= n ? A(NAN) : lse - A(to_acc(row[target]));
    static_cast<A*>(p.loss)[r] = loss;
    static_cast<A*>(p.lse)[r] = lse;
  }
}

// dloss * (exp(x - lse) - (c == target)) for the VEC elements of a vector starting at class c.
template <typename T, int VEC, typename A>
__device__ __forceinline__ Vec<T, VEC> gradient(const Vec<T, VEC>& v, int c, int64_t target, A lse, A d) {
  A x[VEC];
  widen(v.v, x);
  Vec<T, VEC> out;
#pragma unroll
  for (int e = 0; e < VEC; ++e) out.v[e] = from_acc<T>(d * exp_acc(x[e] - lse) - (c + e == target ? d : A(0)));
  return out;
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) cross_entropy_backward_kernel(CrossEntropyParams p) {
  using A = typename AccOf<T>::type;
  constexpr int VEC = 16 / sizeof(T);
  using V = Vec<T, VEC>;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (r >= p.rows) return;
  const int n = static_cast<int>(p.classes), t = threadIdx.x, threads = blockDim.x;
  const T* row = static_cast<const T*>(p.logits) + r * p.row_stride;
  T* out = static_cast<T*>(p.dlogits) + r * p.classes;
  const int64_t target = p.target[r];
  const A lse = static_cast<const A*>(p.lse)[r];
  A d = A(0);
  if (target != p.ignore_index) {
    const A* dloss = static_cast<const A*>(p.dloss);
    d = p.reduction == FN_REDUCE_NONE ? dloss[r] : dloss[0];
    if (p.reduction == FN_REDUCE_MEAN) d /= static_cast<const A*>(p.valid)[0];
    if (target < 0 || target >= n) d = A(NAN);
  }
  const int head = min(head_elements(row), n);
  if (head != min(head_elements(out), n)) {  // x and its gradient at different 16-byte offsets: scalar
    for (int c = t; c < n; c += threads) out[c] = gradient<T, 1>(Vec<T, 1>{{row[c]}}, c, target, lse, d).v[0];
    return;
  }
  const int vecs = (n - head) / VEC, tail = head + vecs * VEC;
  if (t < head) out[t] = gradient<T, 1>(Vec<T, 1>{{row[t]}}, t, target, lse, d).v[0];
  if (tail + t < n) out[tail + t] = gradient<T, 1>(Vec<T, 1>{{row[tail + t]}}, tail + t, target, lse, d).v[0];
  V* out_body = reinterpret_cast<V*>(out + head);
  for_own_vectors(reinterpret_cast<const V*>(row + head), vecs, t, threads, [&](const V& v, int j) {
    store_vec<false>(out_body + j, gradient<T, VEC>(v, head + j * VEC, target, lse, d));
  });
}

// The sum (or mean) of the rows' losses and the count of rows not ignored, by one block in a fixed order
// (the same bits on every run): for calls of up to kCrossEntropyReduceRows rows, where a separate sum, count and
// division would be three more launches than the kernels themselves (loss_binding.cpp sums longer ones).
constexpr int kReduceThreads = 1024;

template <typename A>
__global__ void __launch_bounds__(kReduceThreads) reduce_loss_kernel(CrossEntropyParams p) {
  __shared__ A sums[kReduceThreads / 32], counts[kReduceThreads / 32];
  const A* loss = static_cast<const A*>(p.loss);
  A sum = A(0), count = A(0);
  for (int64_t r = threadIdx.x; r < p.rows; r += kReduceThreads) {
    sum += loss[r];
    count += p.target[r] != p.ignore_index ? A(1) : A(0);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    count += __shfl_xor_sync(0xffffffffu, count, offset);
  }
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = sum, counts[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    sum = count = A(0);
    for (int w = 0; w < kReduceThreads / 32; ++w) sum += sums[w], count += counts[w];
    static_cast<A*>(p.out)[0] = p.reduction == FN_REDUCE_MEAN ? sum / count : sum;
    static_cast<A*>(p.valid)[0] = count;
  }
}

// Threads a row: enough for kUnroll vectors a thread, a power of two from a warp to kMaxThreads.
template <typename T>
int threads_for(int64_t classes) {
  const int64_t vectors = (classes * static_cast<int64_t>(sizeof(T)) + 15) / 16;
  int threads = 32;
  while (threads < kMaxThreads && threads * kUnroll < vectors) threads *= 2;
  return threads;
}

template <typename T>
const char* launch(const CrossEntropyParams& p, bool backward, cudaStream_t stream) {
  const int threads = threads_for<T>(p.classes), rows_per_block = kMaxThreads / threads;
  const dim3 block(threads, rows_per_block);
  const unsigned blocks = static_cast<unsigned>((p.rows + rows_per_block - 1) / rows_per_block);
  if (backward) {
    cross_entropy_backward_kernel<T><<<blocks, block, 0, stream>>>(p);
  } else {
    cross_entropy_forward_kernel<T><<<blocks, block, 0, stream>>>(p);
    if (p.reduction != FN_REDUCE_NONE && p.out) {
      reduce_loss_kernel<typename AccOf<T>::type><<<1, kReduceThreads, 0, stream>>>(p);
    }
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace loss
}  // namespace fastnorm

// The forward (backward false: loss and lse, and with p.out set the reduction) or backward (dlogits) of a
// call; an error message or null.
const char* fastnorm_cuda_cross_entropy(const CrossEntropyParams& p, bool backward, void* stream) {
  using fastnorm::loss::launch;
  if (p.rows == 0) return nullptr;
  if (!p.logits || !p.target || p.classes <= 0 || p.classes > INT32_MAX || p.rows > INT32_MAX ||
      p.reduction < FN_REDUCE_NONE || p.reduction > FN_REDUCE_MEAN ||
      (backward ? !p.dloss || !p.dlogits || !p.lse || (p.reduction == FN_REDUCE_MEAN && !p.valid)
                : !p.loss || !p.lse || (p.out && !p.valid))) {
    return "fastnorm_cuda_cross_entropy: inconsistent parameters";
  }
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.dtype) {
    case FN_F32: return launch<float>(p, backward, s);
    case FN_F64: return launch<double>(p, backward, s);
    case FN_F16: return launch<__half>(p, backward, s);
    case FN_BF16: return launch<__nv_bfloat16>(p, backward, s);
    default: return "fastnorm_cuda_cross_entropy: unsupported dtype";
  }
}
