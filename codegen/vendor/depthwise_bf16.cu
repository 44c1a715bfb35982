// The depthwise / pool stencil kernels for __nv_bfloat16 (depthwise_kernels.h; the calls are depthwise.cu's): one unit
// per dtype, compiled side by side.
#include "depthwise_kernels.h"

namespace nimble_vendor {

void LaunchStencilBF16(int mode, int layout, const void* x, const void* w, const void* b, const void* z, void* y,
                       const StencilParams& p, cudaStream_t s) {
  LaunchTyped<__nv_bfloat16>(mode, layout, x, w, b, z, y, p, s);
}

}  // namespace nimble_vendor
