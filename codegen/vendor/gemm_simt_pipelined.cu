// Our fp32 GEMM's cp.async-pipelined kernels, one for each of kSimtShapes' variants of that kind (gemm_simt_kernels.h;
// the candidates and the calls are gemm_simt.cu's): a unit of their own, compiled beside the other kind's.
#include <utility>

#include "gemm_simt_kernels.h"

namespace nimble_vendor {

cudaError_t LaunchSimtPipelined(int variant, const SimtArgs& p, int splits, cudaStream_t stream) {
  return LaunchSimtKind<true>(variant, p, splits, stream, std::make_index_sequence<kSimtVariantCount>());
}

}  // namespace nimble_vendor
