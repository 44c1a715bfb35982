// The split-key attention kernel for __half q, k, v (attention_split.h; the calls are attention.cu's): one unit per
// dtype, compiled side by side.
#include "attention_split.h"

namespace nimble_vendor {

void LaunchSplitKeyF16(const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v, const void* m,
                       void* y, cudaStream_t stream) {
  if (f32_mask) LaunchSplitTyped<__half, float>(p, q, k, v, m, y, stream);
  else LaunchSplitTyped<__half, __half>(p, q, k, v, m, y, stream);
}

}  // namespace nimble_vendor
