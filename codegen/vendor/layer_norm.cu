// LayerNorm over the last axis as one kernel, for transformers at batch 1:
//
//   nimble.norm.layer_norm(x, gamma, beta, attrs, y, workspace)
//       y[r, :] = (x[r, :] - mean_r) / sqrt(var_r + eps) * gamma + beta,  x and y [..., C] (rows flattened),
//       gamma and beta [C] in x's dtype or float32 (what the mixed-precision policy leaves a 16-bit
//       model's LayerNorm: fp32 parameters, 16-bit tensors); attrs = [eps (float32 bits)].
//
// fp32, fp16 or bf16 in and out; the statistics and the normalization in fp32, rounded once. One
// warp per row, the row held in registers (C <= kMaxC): one read of x, two warp reductions (mean,
// then the centred sum of squares, as PyTorch's kernel does: no cancellation), one write. TVM's
// LayerNorm measured faster inside the models, so the provider runs only when named (see
// benchmarks/findings.md, 'GEMMs at batch 1, build times, bf16 accuracy'). The workspace is unused (the
// vendor calling convention).
#include <cmath>
#include <cstring>

#include "common.h"

namespace nimble_vendor {
namespace {

constexpr const char* kLayerNorm = "nimble.norm.layer_norm";
constexpr int kRowsPerBlock = 4;        // one warp each
constexpr int kMaxPerLane = 32;         // registers per lane: C <= 32 * 32
constexpr int64_t kMaxC = 32 * kMaxPerLane;

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, typename G, int N>  // N: elements per lane, ceil(C / 32)
__global__ void __launch_bounds__(kRowsPerBlock * 32) LayerNormKernel(const T* __restrict__ x, const G* __restrict__ gamma,
                                                                    const G* __restrict__ beta, T* __restrict__ y,
                                                                    int64_t rows, int C, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * C;
  float v[N];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int c = lane + 32 * i;
    v[i] = c < C ? ToF(xr[c]) : 0.0f;
    sum += v[i];
  }
  const float mean = WarpSum(sum) / float(C);
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int c = lane + 32 * i;
    const float d = c < C ? v[i] - mean : 0.0f;
    sq += d * d;
  }
  const float rstd = rsqrtf(WarpSum(sq) / float(C) + eps);
  T* yr = y + row * C;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int c = lane + 32 * i;
    if (c < C) yr[c] = FromF<T>((v[i] - mean) * rstd * ToF(gamma[c]) + ToF(beta[c]));
  }
}

template <typename T, typename G, int N>
void LaunchN(const void* x, const void* g, const void* b, void* y, int64_t rows, int C, float eps, cudaStream_t s) {
  const unsigned blocks = unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);
  LayerNormKernel<T, G, N><<<blocks, kRowsPerBlock * 32, 0, s>>>(static_cast<const T*>(x), static_cast<const G*>(g),
                                                                 static_cast<const G*>(b), static_cast<T*>(y), rows,
                                                                 C, eps);
}

template <typename T, typename G>
void Launch(const void* x, const void* g, const void* b, void* y, int64_t rows, int C, float eps, cudaStream_t s) {
  // the register array's length is a compile-time constant: a few sizes cover C up to kMaxC
  const int n = (C + 31) / 32;
  if (n <= 4) LaunchN<T, G, 4>(x, g, b, y, rows, C, eps, s);
  else if (n <= 8) LaunchN<T, G, 8>(x, g, b, y, rows, C, eps, s);
  else if (n <= 12) LaunchN<T, G, 12>(x, g, b, y, rows, C, eps, s);
  else if (n <= 16) LaunchN<T, G, 16>(x, g, b, y, rows, C, eps, s);
  else if (n <= 24) LaunchN<T, G, 24>(x, g, b, y, rows, C, eps, s);
  else LaunchN<T, G, kMaxPerLane>(x, g, b, y, rows, C, eps, s);
}

template <typename T>
void LaunchFor(bool f32_params, const void* x, const void* g, const void* b, void* y, int64_t rows, int C, float eps,
               cudaStream_t s) {
  if (f32_params) Launch<T, float>(x, g, b, y, rows, C, eps, s);
  else Launch<T, T>(x, g, b, y, rows, C, eps, s);
}

void LayerNorm(TensorView x, TensorView gamma, TensorView beta, Shape attrs, TensorView y, TensorView workspace) {
  const char* op = kLayerNorm;
  if (attrs.size() != 1) FailValue(op, "attrs must be [eps (float32 bits)], got " + ShapeStr(attrs.data(), int(attrs.size())));
  if (x.device().device_type != kDLCUDA) FailValue(op, "x must be a CUDA tensor");
  const int dev = x.device().device_id;
  const int dtype = TensorDType(x);
  if (dtype < 0) FailValue(op, "x has dtype " + DLTypeStr(x.dtype()) + ": " + kDTypesTaken);
  CheckCudaTensor(op, "x", x, dev);
  CheckCudaTensor(op, "gamma", gamma, dev);
  CheckCudaTensor(op, "beta", beta, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckWorkspace(op, workspace, dev);
  CheckDType(op, "y", y, dtype);
  const int pdtype = TensorDType(gamma);
  if (pdtype != dtype && pdtype != kF32) {
    FailValue(op, "gamma has dtype " + DLTypeStr(gamma.dtype()) + ": it must be x's dtype or float32");
  }
  CheckDType(op, "beta", beta, pdtype);
  if (x.ndim() < 1) FailValue(op, "x must have at least one axis");
  const int64_t C = x.shape()[x.ndim() - 1];
  if (C < 1 || C > kMaxC) FailValue(op, "the normalized axis has " + std::to_string(C) + " elements; 1 to " +
                                            std::to_string(kMaxC) + " are supported");
  CheckNdim(op, "gamma", gamma, 1);
  CheckNdim(op, "beta", beta, 1);
  if (gamma.shape()[0] != C || beta.shape()[0] != C) {
    FailValue(op, "gamma " + ShapeStr(gamma) + " and beta " + ShapeStr(beta) + " must both be [" + std::to_string(C) + "]");
  }
  bool same = y.ndim() == x.ndim();
  for (int i = 0; same && i < x.ndim(); ++i) same = y.shape()[i] == x.shape()[i];
  if (!same) FailValue(op, "y has shape " + ShapeStr(y) + " but x has " + ShapeStr(x));
  const int64_t rows = x.numel() / C;
  if (rows == 0) return;
  uint32_t bits = uint32_t(attrs[0]);
  float eps;
  std::memcpy(&eps, &bits, sizeof(eps));
  if (!(eps > 0.0f) || !std::isfinite(eps)) FailValue(op, "eps must be a positive float32, got " + std::to_string(eps));
  DeviceGuard guard(dev, op);
  cudaStream_t s = CurrentStream(dev);
  const bool f32_params = pdtype == kF32 && dtype != kF32;
  if (dtype == kF32) Launch<float, float>(DataPtr(x), DataPtr(gamma), DataPtr(beta), DataPtr(y), rows, int(C), eps, s);
  else if (dtype == kF16) LaunchFor<__half>(f32_params, DataPtr(x), DataPtr(gamma), DataPtr(beta), DataPtr(y), rows, int(C), eps, s);
  else LaunchFor<__nv_bfloat16>(f32_params, DataPtr(x), DataPtr(gamma), DataPtr(beta), DataPtr(y), rows, int(C), eps, s);
  CheckCuda(cudaGetLastError(), op, "layer norm kernel launch");
}

__attribute__((constructor)) void RegisterLayerNorm() {
  try {
    Register(kLayerNorm, LayerNorm);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
