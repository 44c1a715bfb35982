// What the fused-attention units share: attention.cu (the row-per-warp and split-key kernels, and the calls'
// registration) and attention_tile.cu (the register-tiled kernel).
#pragma once

#include <cstdint>

#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {

// The tile kernel (attention_tile.cu) on q, k, v of `dtype` (kF32 / kF16 / kBF16; the mask m in fp32 when
// f32_mask, else in q's dtype, or null) into y, on `stream`; false when the head's K does not fit a block's
// shared memory (nothing launched: the caller runs the row-per-warp kernel).
bool LaunchTileAttention(const char* op, const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k,
                         const void* v, const void* m, void* y, cudaStream_t stream);

// The key-split kernel (attention_cluster.cu) on fp32 q, k, v (and an fp32 mask m, or null) into y, on `stream`;
// false when it does not take the call (another dtype, a head over 64, unaligned rows, over 512 keys, or over 64
// keys without thread-block clusters; nothing launched: the caller runs the tile kernel).
bool LaunchClusterAttention(const char* op, const SdpaParams& p, int dtype, const void* q, const void* k,
                            const void* v, const void* m, void* y, cudaStream_t stream);

namespace {

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
