// The small kernels the host-only units launch (nimble_vendor.cpp, cudnn_conv_graph.cpp, cudnn_attention.cpp): the
// bias/activation epilogue, an attention mask as the bias cuDNN's SDPA reads, and the spin behind which GpuUsPerCall
// (common.h) times a sequence of calls. Those units are C++ compiled without nvcc's device pass (the cuDNN frontend's
// headers alone kept the device compiler busy for minutes), so their kernels live here, behind the functions
// conv_args.h, sdpa_args.h and common.h declare. Registers no function.
#include "common.h"
#include "conv_args.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

// Computed in fp32 and rounded once, whatever T is.
template <typename T>
__global__ void BiasActKernel(T* __restrict__ y, const T* __restrict__ bias, const T* z, int64_t n,
                              int64_t inner, int64_t channels, int act) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = ToF(y[i]);
    if (bias != nullptr) v += ToF(bias[(i / inner) % channels]);
    if (z != nullptr) v += ToF(z[i]);
    y[i] = FromF<T>(Activate(v, act));
  }
}

// Waits `ns` nanoseconds on the GPU (GpuUsPerCall queues its calls behind it).
__global__ void SpinKernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// A mask through its strides -> a contiguous [Bm, Hm, Sq, Sk] tensor of O, clamped to O's finite range.
template <typename M, typename O>
__global__ void BiasToHalfKernel(const M* __restrict__ m, O* __restrict__ out, int64_t Hm, int64_t Sq, int64_t Sk,
                                 int64_t sb, int64_t sh, int64_t sq, int64_t sk, int64_t n, float lowest) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t c = i % Sk, r = (i / Sk) % Sq, h = (i / (Sk * Sq)) % Hm, b = i / (Sk * Sq * Hm);
    float v = ToF(m[b * sb + h * sh + r * sq + c * sk]);
    if (!(v != v)) v = fminf(fmaxf(v, lowest), -lowest);  // NaN is kept: never hidden
    out[i] = FromF<O>(v);
  }
}

template <typename M>
void LaunchBiasToHalfFrom(const SdpaParams& p, const M* m, int out_dtype, void* out, cudaStream_t stream) {
  const int64_t Bm = p.m_sb ? p.B : 1, Hm = p.m_sh ? p.H : 1, n = Bm * Hm * p.Sq * p.Sk;
  const int threads = 256;
  const unsigned blocks = unsigned(std::min<int64_t>((n + threads - 1) / threads, 65536));
  if (out_dtype == kF16) {
    BiasToHalfKernel<M, __half><<<blocks, threads, 0, stream>>>(m, static_cast<__half*>(out), Hm, p.Sq, p.Sk, p.m_sb,
                                                                 p.m_sh, p.m_sq, p.m_sk, n, -65504.0f);
  } else {
    BiasToHalfKernel<M, __nv_bfloat16><<<blocks, threads, 0, stream>>>(
        m, static_cast<__nv_bfloat16*>(out), Hm, p.Sq, p.Sk, p.m_sb, p.m_sh, p.m_sq, p.m_sk, n, -3.3895314e38f);
  }
}

}  // namespace

void LaunchSdpaBiasToHalf(const char* op, const SdpaParams& p, int mask_dtype, const void* m, int out_dtype, void* out,
                          cudaStream_t stream) {
  if (mask_dtype == kF32) {
    LaunchBiasToHalfFrom(p, static_cast<const float*>(m), out_dtype, out, stream);
  } else if (mask_dtype == kF16) {
    LaunchBiasToHalfFrom(p, static_cast<const __half*>(m), out_dtype, out, stream);
  } else {
    LaunchBiasToHalfFrom(p, static_cast<const __nv_bfloat16*>(m), out_dtype, out, stream);
  }
  CheckCuda(cudaGetLastError(), op, "mask conversion kernel launch");
}

void LaunchBiasAct(const char* op, int dtype, void* y, const void* bias, const void* z, int64_t n,
                   int64_t inner, int64_t channels, int act, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65536);
  if (dtype == kF32) {
    BiasActKernel<float><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<float*>(y), static_cast<const float*>(bias), static_cast<const float*>(z), n, inner,
        channels, act);
  } else if (dtype == kF16) {
    BiasActKernel<__half><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<__half*>(y), static_cast<const __half*>(bias), static_cast<const __half*>(z), n, inner,
        channels, act);
  } else {
    BiasActKernel<__nv_bfloat16><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(y), static_cast<const __nv_bfloat16*>(bias),
        static_cast<const __nv_bfloat16*>(z), n, inner, channels, act);
  }
  CheckCuda(cudaGetLastError(), op, "bias/activation kernel launch");
}

double GpuUsPerCall(cudaStream_t stream, int64_t reps, const std::function<bool()>& call) {
  for (int w = 0; w < 2; ++w) {
    if (!call()) return -1.0;
  }
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return -1.0;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return -1.0;
  }
  SpinKernel<<<1, 1, 0, stream>>>(50000ull + 20000ull * uint64_t(reps));
  bool ok = cudaGetLastError() == cudaSuccess && cudaEventRecord(start, stream) == cudaSuccess;
  for (int64_t r = 0; r < reps && ok; ++r) ok = call();
  ok = cudaEventRecord(stop, stream) == cudaSuccess && ok;
  float ms = 0;
  ok = ok && cudaEventSynchronize(stop) == cudaSuccess && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();
  return ok ? double(ms) * 1000.0 / double(reps) : -1.0;
}

}  // namespace nimble_vendor
