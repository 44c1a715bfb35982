// Our GEMV's kernels for __nv_bfloat16 weights (gemv_kernels.h; the calls are gemv.cu's): one unit per dtype, compiled
// side by side.
#include "gemv_kernels.h"

namespace nimble_vendor {

cudaError_t LaunchGemvBF16(int M, int most, const GemvArgs& p, bool out_f32, cudaStream_t stream) {
  if (out_f32) return LaunchGemv<__nv_bfloat16, float>(M, most, p, stream);
  return LaunchGemv<__nv_bfloat16, __nv_bfloat16>(M, most, p, stream);
}

}  // namespace nimble_vendor
