// Our GEMV's kernels for __half weights (gemv_kernels.h; the calls are gemv.cu's): one unit per dtype, compiled
// side by side.
#include "gemv_kernels.h"

namespace nimble_vendor {

cudaError_t LaunchGemvF16(int M, int most, const GemvArgs& p, bool out_f32, cudaStream_t stream) {
  if (out_f32) return LaunchGemv<__half, float>(M, most, p, stream);
  return LaunchGemv<__half, __half>(M, most, p, stream);
}

}  // namespace nimble_vendor
