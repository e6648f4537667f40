// The package build's FASTNORM_WANT_* macros: every input dtype and kernel family (kernel_set.h says how a
// single-file solution chooses them instead). Apart from kernel_set.h so that binding.cpp can ask them and take
// nothing else: in a solution this file resolves to nothing.
#pragma once

#ifndef FASTNORM_SELECTED_KERNELS
// Input dtypes, each with the weight dtypes it takes (its own, float32 for the half types).
#define FASTNORM_WANT_F32
#define FASTNORM_WANT_F64
#define FASTNORM_WANT_F16
#define FASTNORM_WANT_BF16
// Kernel families of norm_forward (planner.cuh); the CPU kernels have ROW and CHANNEL only.
#define FASTNORM_WANT_ROW        // last-dim rows: row_kernel.cuh, norm_cpu.cpp forward_rows
#define FASTNORM_WANT_FEW_ROWS   // few_rows_kernel.cuh
#define FASTNORM_WANT_OFFSET_ROWS  // offset_rows_kernel.cuh (scalar rows of 1-16377 elements, bfloat16 32761: a group of threads or a thread a row), strided_rows_kernel.cuh (scalar rows of 1025-16384, a block a row), granule_rows_kernel.cuh (scalar 2- and 4-byte rows of 1025 or 2048 elements up to 24 KB, a block a row, 16-byte granules), packed_rows_kernel.cuh (rows of 2-16 bytes, whole rows in a vector)
#define FASTNORM_WANT_SPLIT      // split_kernels.cuh split_slice_kernel (slices cached in shared memory)
#define FASTNORM_WANT_SPLIT_UNCACHED  // split_kernels.cuh split_row_norm_kernel (too many slices to cache)
#define FASTNORM_WANT_CLUSTER    // cluster_kernel.cuh
#define FASTNORM_WANT_HELD_ROWS  // held_rows_kernel.cuh
#define FASTNORM_WANT_RESIDENT   // resident_kernel.cuh
#define FASTNORM_WANT_STREAMED   // streamed_kernels.cuh
#define FASTNORM_WANT_CHANNEL    // a non-trailing axis: channel_kernels.cuh, norm_cpu.cpp forward_channels
#define FASTNORM_WANT_RESIDUAL   // the fused residual add of add_norm_forward: residual_rows.cuh
// Forward paths of the normalization family: a block a set (family_set_kernels.cuh), the multi-kernel path
// (family_kernels.cuh) and its p-norm statistics (|x| and x^2 sums, p_normalize's alone), GroupNorm's
// chained sets (family_chain_kernel.cuh: the lag chain, and the held chain of sets of 2 MB up).
#define FASTNORM_WANT_FAMILY_SETS
#define FASTNORM_WANT_FAMILY_PASSES
#define FASTNORM_WANT_P_NORM
#define FASTNORM_WANT_GROUP_CHAIN
#define FASTNORM_WANT_GROUP_HELD
#endif
