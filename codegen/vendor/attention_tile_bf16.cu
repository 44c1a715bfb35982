// The register-tiled attention kernel for __nv_bfloat16 q, k, v (attention_tile.h; the calls are attention.cu's): one
// unit per dtype, compiled side by side.
#include "attention_tile.h"

namespace nimble_vendor {

bool LaunchTileBF16(const char* op, const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v,
                    const void* m, void* y, cudaStream_t stream) {
  if (f32_mask) return LaunchTileTyped<__nv_bfloat16, float>(op, p, q, k, v, m, y, stream);
  return LaunchTileTyped<__nv_bfloat16, __nv_bfloat16>(op, p, q, k, v, m, y, stream);
}

}  // namespace nimble_vendor
