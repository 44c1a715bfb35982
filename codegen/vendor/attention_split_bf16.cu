// The split-key attention kernel for __nv_bfloat16 q, k, v (attention_split.h; the calls are attention.cu's): one
// unit per dtype, compiled side by side.
#include "attention_split.h"

namespace nimble_vendor {

void LaunchSplitKeyBF16(const SdpaParams& p, bool f32_mask, const void* q, const void* k, const void* v, const void* m,
                        void* y, cudaStream_t stream) {
  if (f32_mask) LaunchSplitTyped<__nv_bfloat16, float>(p, q, k, v, m, y, stream);
  else LaunchSplitTyped<__nv_bfloat16, __nv_bfloat16>(p, q, k, v, m, y, stream);
}

}  // namespace nimble_vendor
