// The split-key attention kernel for float q, k, v (attention_split.h; the calls are attention.cu's): one unit per
// dtype, compiled side by side.
#include "attention_split.h"

namespace nimble_vendor {

void LaunchSplitKeyF32(const SdpaParams& p, const void* q, const void* k, const void* v, const void* m, void* y,
                       cudaStream_t stream) {
  LaunchSplitTyped<float, float>(p, q, k, v, m, y, stream);
}

}  // namespace nimble_vendor
