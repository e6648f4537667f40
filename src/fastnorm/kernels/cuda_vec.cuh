// Device-side basics shared by every CUDA kernel: the accumulator type of each dtype and the
// conversions to and from it, aligned vectors, loads and stores with L2 hints, asynchronous copies
// into shared memory, and parameter (weight, bias) loads.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace fastnorm {

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <typename T> __device__ __forceinline__ T from_acc(double v) { return static_cast<T>(v); }

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return 1.0 / sqrt(v); }

// VEC values of T in the accumulator type. bf16 pairs take one integer instruction each (the
// generic conversion spends a permute and a shift on every odd element): half the instructions of
// the bf16 row kernel were conversions and addressing (ncu, H100).
template <typename A, typename T, int VEC>
__device__ __forceinline__ void widen(const T (&v)[VEC], A (&out)[VEC]) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value && VEC % 2 == 0) {
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(v);
#pragma unroll
    for (int e = 0; e < VEC / 2; ++e) {
      out[2 * e] = __uint_as_float(pairs[e] << 16);
      out[2 * e + 1] = __uint_as_float(pairs[e] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = A(to_acc(v[e]));
  }
}

// VEC elements of T moved as one aligned access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Loads of x: streaming (read once, evict first) when the data is cached in registers; plain when
// it will be read again soon and should stay in L2.
template <bool kStream, typename V>
__device__ __forceinline__ V load_vec(const V* p) {
  V out;
  if constexpr (sizeof(V) == 16) {
    uint4 r = kStream ? __ldcs(reinterpret_cast<const uint4*>(p)) : *reinterpret_cast<const uint4*>(p);
    out = *reinterpret_cast<V*>(&r);
  } else if constexpr (sizeof(V) == 8) {
    uint2 r = kStream ? __ldcs(reinterpret_cast<const uint2*>(p)) : *reinterpret_cast<const uint2*>(p);
    out = *reinterpret_cast<V*>(&r);
  } else {
    out = *p;
  }
  return out;
}

// L2 hints on x and y (H100, benchmarks/NOTES.md "hints", "plain"): the row, channel-tile, cluster
// and split-slice kernels run 1.5-10 points of copy bandwidth faster without them; the resident
// kernel, which re-reads parameters and finds its next row in L2 while x and y stream, runs up to 8
// points faster with x read and y stored evict-first. Hence the switch.
template <bool kEvictFirst = true, typename V>
__device__ __forceinline__ void store_vec(V* p, const V& v) {
  if constexpr (sizeof(V) == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(&v);
    if (kEvictFirst) __stcs(reinterpret_cast<uint4*>(p), r); else *reinterpret_cast<uint4*>(p) = r;
  } else if constexpr (sizeof(V) == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(&v);
    if (kEvictFirst) __stcs(reinterpret_cast<uint2*>(p), r); else *reinterpret_cast<uint2*>(p) = r;
  } else {
    *p = v;
  }
}

// Bytes [b, b + 16) of the 32 bytes lo:hi (b < 16, uniform across the block): 16 bytes realigned
// to another 16-byte grid (a chunk of x to y's). Word i is a funnel shift of words i + b / 4 and i + b / 4 + 1.
__device__ __forceinline__ uint4 realigned(const uint4& lo, const uint4& hi, int b) {
  const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const int q = b >> 2;
  uint32_t s[5];
#pragma unroll
  for (int i = 0; i < 5; ++i) s[i] = q == 0 ? w[i] : q == 1 ? w[i + 1] : q == 2 ? w[i + 2] : w[i + 3];
  const unsigned r = unsigned(b & 3) * 8;
  return make_uint4(__funnelshift_r(s[0], s[1], r), __funnelshift_r(s[1], s[2], r), __funnelshift_r(s[2], s[3], r),
                    __funnelshift_r(s[3], s[4], r));
}

// A counter or flag another block writes (the split kernels' barriers, the chained sets' flags): the
// acquire load sees everything its writer stored before the release.
__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned int* p, unsigned int v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Asynchronous global -> shared copies: a thread issues all of its copies before waiting, so its
// whole share of a row is in flight without holding registers. 16-byte copies bypass L1.
template <int kBytes, bool kEvictFirst = true>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16 && kEvictFirst) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "l"(policy)
                 : "memory");
  } else if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(src), "n"(kBytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Groups of copies, for double buffering: commit closes the thread's copies issued so far into a
// group; wait_group<N> waits until at most N of its groups are still in flight.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Parameters re-read by every wave of the split kernel: loaded with an L2 evict-last policy so
// that the streamed x and y do not push them out. `release_params` sets them back to normal
// priority at the end, so nothing stays pinned in L2 after the call.
__device__ __forceinline__ uint4 load16_keep(const uint4* p) {
  uint64_t policy;
  uint4 r;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(policy));
  return r;
}

__device__ __forceinline__ void release_params(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = int64_t(threadIdx.x) * 128; off < bytes; off += int64_t(blockDim.x) * 128) {
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(c + off) : "memory");
  }
}

// The block's threads prefetch `bytes` from p into L2, a 128-byte line each in turn, without waiting.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = int64_t(threadIdx.x) * 128; off < bytes; off += int64_t(blockDim.x) * 128) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + off));
  }
}

// use(i, load(i)) for i = first, first + step, ... below end, U loads issued before their uses: a thread
// keeps U accesses in flight even where use stores (the compiler cannot hoist a load above a store
// that may alias it).
template <int U, typename I, typename Load, typename Use>
__device__ __forceinline__ void strided_batches(I first, I step, I end, Load&& load, Use&& use) {
  I i = first;
  if constexpr (U > 1) {
    for (; i + (U - 1) * step < end; i += U * step) {
      decltype(load(i)) v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = load(i + u * step);
#pragma unroll
      for (int u = 0; u < U; ++u) use(i + u * step, v[u]);
    }
  }
  for (; i < end; i += step) use(i, load(i));
}

// The parameters (weight or bias) of one vector as loaded, converted when used: kept in shared
// memory by the resident kernel, and in flight in batches by the split kernel (a batch takes a
// quarter of the registers of converted bf16 values).
template <typename W, int VEC>
struct alignas(int(sizeof(W)) * VEC % 16 == 0 ? 16 : alignof(W)) ParamVec {
  W v[VEC];
};

// The parameters of VEC consecutive columns, in 16-byte pieces when aligned. Plain loads (normal
// L2 priority); kKeep: evict-last, for parameters re-read by every wave of the split kernel.
// Not __ldg: the compiler may hoist that intrinsic above the caller's null check of an absent bias.
template <bool kKeep, typename W, int VEC>
__device__ __forceinline__ ParamVec<W, VEC> load_param_vec(const W* p) {
  ParamVec<W, VEC> r;
  constexpr int kBytes = int(sizeof(W)) * VEC;
  if constexpr (VEC > 1 && kBytes % 16 == 0) {
#pragma unroll
    for (int piece = 0; piece < kBytes / 16; ++piece) {
      const uint4* q = reinterpret_cast<const uint4*>(p) + piece;
      reinterpret_cast<uint4*>(r.v)[piece] = kKeep ? load16_keep(q) : *q;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) r.v[e] = p[e];
  }
  return r;
}

// The same, converted to the accumulator type.
template <bool kKeep, int VEC, typename W, typename A>
__device__ __forceinline__ void load_params(const W* p, A (&out)[VEC]) {
  widen(load_param_vec<kKeep, W, VEC>(p).v, out);
}

}  // namespace fastnorm
