// The register-tiled attention kernel for float q, k, v (attention_tile.h; the calls are attention.cu's): one unit
// per dtype, compiled side by side.
#include "attention_tile.h"

namespace nimble_vendor {

bool LaunchTileF32(const char* op, const SdpaParams& p, const void* q, const void* k, const void* v, const void* m,
                   void* y, cudaStream_t stream) {
  return LaunchTileTyped<float, float>(op, p, q, k, v, m, y, stream);
}

}  // namespace nimble_vendor
