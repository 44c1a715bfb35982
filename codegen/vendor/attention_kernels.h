// What the fused-attention units share: attention.cu (the calls and their registration), attention_split_*.cu (the
// split-key kernel, one unit per dtype), attention_rows.cu (the row-per-warp kernel), attention_decode.cu (the
// decode kernel and the cache-appending calls), attention_tile_*.cu (the register-tiled kernel, one unit per
// dtype) and attention_cluster.cu (the key-split fp32 kernel).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {

// The tile kernel (attention_tile.h) on q, k, v of one dtype each (attention_tile_f32.cu, _f16.cu, _bf16.cu; the
// 16-bit ones with the mask m in fp32 when f32_mask, else in q's dtype, or null) into y, on `stream`; false when the
// head's K does not fit a block's shared memory (nothing launched: the caller runs the row-per-warp kernel).
bool LaunchTileF32(const char* op, const SdpaParams& p, const void* q, const void* k, const void* v, const void* m,
                   void* y, cudaStream_t stream);
bool LaunchTileF16(const char* op, const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v,
                   const void* m, void* y, cudaStream_t stream);
bool LaunchTileBF16(const char* op, const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v,
                    const void* m, void* y, cudaStream_t stream);

// The key-split kernel (attention_cluster.cu) on fp32 q, k, v (and an fp32 mask m, or null) into y, on `stream`;
// false when it does not take the call (another dtype, a head over 64, unaligned rows, over 512 keys, or over 64
// keys without thread-block clusters; nothing launched: the caller runs the tile kernel).
bool LaunchClusterAttention(const char* op, const SdpaParams& p, int dtype, const void* q, const void* k,
                            const void* v, const void* m, void* y, cudaStream_t stream);

// The decode kernel (attention_decode.cu) on q, k, v of `dtype` (the mask m in fp32 when f32_mask, else in q's dtype,
// or null) into y, on `stream`; false when it does not take the call (more than one query row per head, D != Dv,
// D not 64 or 128, or rows not 16-byte aligned; nothing launched).
bool LaunchDecodeAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k, const void* v,
                           const void* m, void* y, cudaStream_t stream);

// The row-per-warp kernel (attention_rows.cu), as sdpa_bias runs it on a call the decode kernel does not take.
void LaunchRowPerWarpAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k,
                               const void* v, const void* m, void* y, cudaStream_t stream);

// The split-key kernel (attention_split.h) for heads up to 64, one dtype each (attention_split_f32.cu, _f16.cu,
// _bf16.cu; the 16-bit ones with the mask in fp32 when f32_mask, else in q's dtype).
void LaunchSplitKeyF32(const SdpaParams& p, const void* q, const void* k, const void* v, const void* m, void* y,
                       cudaStream_t stream);
void LaunchSplitKeyF16(const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v, const void* m,
                       void* y, cudaStream_t stream);
void LaunchSplitKeyBF16(const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v, const void* m,
                        void* y, cudaStream_t stream);

// The split-key call as split_sdpa_bias runs it (attention.cu: the decode kernel where it takes the call, the
// row-per-warp kernel for heads over 64).
void LaunchSplitKeyAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k,
                             const void* v, const void* m, void* y, cudaStream_t stream);

namespace {

// f(T(), M()) for q, k, v of `dtype` (kF32 / kF16 / kBF16) and a mask of M: float for an fp32 model or a 16-bit
// model's fp32 mask (f32_mask), else T; f's result. Each unit instantiates its kernels through it for every pair.
template <typename F>
auto WithAttentionTypes(int dtype, bool f32_mask, F&& f) {
  if (dtype == kF32) return f(float(), float());
  if (dtype == kF16) return f32_mask ? f(__half(), float()) : f(__half(), __half());
  return f32_mask ? f(__nv_bfloat16(), float()) : f(__nv_bfloat16(), __nv_bfloat16());
}

// `a` (shared memory) of block c of this block's cluster: this block's own where C = 1 (no cluster)
__device__ __forceinline__ float* OfBlock(float* a, int c, int C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (C > 1) return cooperative_groups::this_cluster().map_shared_rank(a, c);
#endif
  return a;
}

// A barrier over the block's cluster (C > 1; the host launches clusters only on sm_90 and later), else the block.
__device__ __forceinline__ void ClusterSync(int C) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (C > 1) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#else
  if (C > 1) __trap();
#endif
  __syncthreads();
}

// 4 consecutive elements of a row as floats, zero past n (vector loads when the caller knows the row
// and d are 16-byte (fp32) / 8-byte (16-bit) aligned and d + 4 <= n)
template <typename T>
__device__ __forceinline__ float4 Load4(const T* row, int d, int n, bool vec) {
  if (vec && d + 4 <= n) {
    if constexpr (sizeof(T) == 4) {
      return *reinterpret_cast<const float4*>(row + d);
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + d);
      const T* h = reinterpret_cast<const T*>(&raw);
      return make_float4(ToF(h[0]), ToF(h[1]), ToF(h[2]), ToF(h[3]));
    }
  }
  return make_float4(d < n ? ToF(row[d]) : 0.0f, d + 1 < n ? ToF(row[d + 1]) : 0.0f,
                     d + 2 < n ? ToF(row[d + 2]) : 0.0f, d + 3 < n ? ToF(row[d + 3]) : 0.0f);
}

}  // namespace
}  // namespace nimble_vendor
