// Our GEMV for the few rows of a decode step (provider gemv): 16-bit weights read once, at the memory's speed.
//
//   nimble.gemv.matmul(a, w, bias, attrs, y, workspace)
//   nimble.gemv.matmul_add(a, w, bias, z, attrs, y, workspace)
//       y[m, n] = act(sum_k a[m, k] * w[n, k] + bias[n] (+ z[m, n])); a [..., M, K] (rows flattened, M <= 4),
//       w [N, K] (the provider stores every Linear's weights so), a and w fp16 or bf16; bias, z and y in a's dtype or
//       float32 (a residual stream kept in fp32); y any shape of M rows of N; attrs = [activation] (0 identity,
//       1 relu, 2 relu6, 3 gelu, 4 gelu's tanh approximation). fp32 accumulation, rounded once.
//
// Why: at M = 1 a Linear is a matrix-vector product whose time is reading W. cuBLASLt's kernels for it (64x8
// tiles, split-K with a second reduction kernel) ran GPT-2's decode GEMMs well under the memory's bandwidth
// (benchmarks/findings.md, 'Decode steps on the H200'). Here each output column is a row of W read by
// S warps (S = 1, 2, 4 or 8, as many as the grid needs to fill the GPU: a short, wide W is split along K), each
// lane 16 bytes a load, four loads in flight; the S partial sums meet in shared memory, and the column's epilogue
// is one thread's. K must be a multiple of 8 and every tensor 16-byte aligned (the provider and the checks here
// say so in one line otherwise). The workspace is unused (the vendor calling convention).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common.h"

namespace nimble_vendor {
namespace {

constexpr const char* kGemv = "nimble.gemv.matmul";
constexpr const char* kGemvAdd = "nimble.gemv.matmul_add";
constexpr int kGemvWarps = 8, kGemvMaxRows = 4, kGemvUnroll = 4;

// 8 consecutive 16-bit values as floats
template <typename T>
__device__ __forceinline__ void Unpack8(const uint4& raw, float* f) {
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = ToF(h[i]);
}

// grid.x: column groups of kGemvWarps / S columns; S warps of a block share a column, each a K slice.
template <typename T, typename O, int M, int S>
__global__ void __launch_bounds__(kGemvWarps * 32) GemvKernel(const T* __restrict__ a, const T* __restrict__ w,
                                                             const O* __restrict__ bias, const O* z, O* y, int N,
                                                             int K, int act) {
  constexpr int kCols = kGemvWarps / S;
  __shared__ float partial[kGemvWarps][M];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = blockIdx.x * kCols + warp / S, slice = warp % S;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  if (col < N) {
    const int vecs = K / 8;  // 16-byte vectors in a row
    const uint4* wr = reinterpret_cast<const uint4*>(w + int64_t(col) * K);
    const int first = slice * 32 + lane, step = S * 32;
    int v = first;
    for (; v + (kGemvUnroll - 1) * step < vecs; v += kGemvUnroll * step) {  // kGemvUnroll loads in flight
      uint4 wv[kGemvUnroll];
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) wv[u] = __ldg(wr + v + u * step);
#pragma unroll
      for (int u = 0; u < kGemvUnroll; ++u) {
        float wf[8];
        Unpack8<T>(wv[u], wf);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float af[8];
          Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(a + int64_t(m) * K) + v + u * step), af);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m] = fmaf(af[i], wf[i], acc[m]);
        }
      }
    }
    for (; v < vecs; v += step) {
      float wf[8];
      Unpack8<T>(__ldg(wr + v), wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float af[8];
        Unpack8<T>(__ldg(reinterpret_cast<const uint4*>(a + int64_t(m) * K) + v), af);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] = fmaf(af[i], wf[i], acc[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if (S > 1) {
    if (lane == 0) {
#pragma unroll
      for (int m = 0; m < M; ++m) partial[warp][m] = acc[m];
    }
    __syncthreads();
  }
  // the column's epilogue: lane m of the column's first warp writes row m
  if (col < N && slice == 0 && lane < M) {
    float sum = 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      if (m != lane) continue;
      if (S > 1) {
        for (int s = 0; s < S; ++s) sum += partial[warp + s][m];
      } else {
        sum = acc[m];
      }
    }
    const int64_t at = int64_t(lane) * N + col;
    const float before = sum + ToF(bias[col]) + (z != nullptr ? ToF(z[at]) : 0.0f);
    y[at] = FromF<O>(Activate(before, act));
  }
}

// S: warps a column, the fewest whose grid reaches four warps a core's slot (kGemvWarps x SMs x 4), keeping at
// least one 16-byte vector a lane of each slice
int GemvSplits(int64_t N, int64_t K, int64_t sms) {
  const int64_t want = sms * kGemvWarps * 4, vecs = K / 8;
  int s = 1;
  while (s < kGemvWarps && N * s < want && vecs >= int64_t(2 * s) * 32) s *= 2;
  return s;
}

template <typename T, typename O, int M, int S>
void LaunchGemvS(const void* a, const void* w, const void* bias, const void* z, void* y, int N, int K, int act,
                 cudaStream_t stream) {
  constexpr int cols = kGemvWarps / S;
  GemvKernel<T, O, M, S><<<unsigned((N + cols - 1) / cols), kGemvWarps * 32, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(w), static_cast<const O*>(bias), static_cast<const O*>(z),
      static_cast<O*>(y), N, K, act);
}

template <typename T, typename O, int M>
void LaunchGemvM(int s, const void* a, const void* w, const void* bias, const void* z, void* y, int N, int K, int act,
                 cudaStream_t stream) {
  if (s == 1) LaunchGemvS<T, O, M, 1>(a, w, bias, z, y, N, K, act, stream);
  else if (s == 2) LaunchGemvS<T, O, M, 2>(a, w, bias, z, y, N, K, act, stream);
  else if (s == 4) LaunchGemvS<T, O, M, 4>(a, w, bias, z, y, N, K, act, stream);
  else LaunchGemvS<T, O, M, 8>(a, w, bias, z, y, N, K, act, stream);
}

template <typename T, typename O>
void LaunchGemv(int M, int s, const void* a, const void* w, const void* bias, const void* z, void* y, int N, int K,
                int act, cudaStream_t stream) {
  if (M == 1) LaunchGemvM<T, O, 1>(s, a, w, bias, z, y, N, K, act, stream);
  else if (M == 2) LaunchGemvM<T, O, 2>(s, a, w, bias, z, y, N, K, act, stream);
  else if (M == 3) LaunchGemvM<T, O, 3>(s, a, w, bias, z, y, N, K, act, stream);
  else LaunchGemvM<T, O, 4>(s, a, w, bias, z, y, N, K, act, stream);
}

void RunGemv(const char* op, TensorView a, TensorView w, TensorView bias, const TensorView* z, const Shape& attrs,
             TensorView y, TensorView workspace) {
  if (attrs.size() != 1) FailValue(op, "attrs must be [activation], got " + ShapeStr(attrs.data(), int(attrs.size())));
  const int act = int(attrs[0]);
  if (act < 0 || act > kMaxActivation) {
    FailValue(op, std::string("activation must be ") + kActivations + ", got " + std::to_string(attrs[0]));
  }
  if (a.device().device_type != kDLCUDA) FailValue(op, "a must be a CUDA tensor");
  const int dev = a.device().device_id;
  const int dtype = TensorDType(a);
  if (dtype != kF16 && dtype != kBF16) {
    FailValue(op, "a has dtype " + DLTypeStr(a.dtype()) + ": this kernel takes float16 or bfloat16 (fp32 GEMMs are "
                  "cuBLASLt's or nimble.gemm's)");
  }
  CheckCudaTensor(op, "a", a, dev);
  CheckCudaTensor(op, "w", w, dev);
  CheckCudaTensor(op, "bias", bias, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckWorkspace(op, workspace, dev);
  CheckDType(op, "w", w, dtype);
  const int out_dtype = GemmOutDType(op, dtype, y, bias);
  if (a.ndim() < 2) FailValue(op, "a must be [..., M, K], got " + ShapeStr(a));
  CheckNdim(op, "w", w, 2);
  CheckNdim(op, "bias", bias, 1);
  const int64_t K = a.shape()[a.ndim() - 1], M = a.numel() / std::max<int64_t>(K, 1), N = w.shape()[0];
  if (w.shape()[1] != K) FailValue(op, "a " + ShapeStr(a) + " and w " + ShapeStr(w) + " ([N, K]) disagree on K");
  if (M < 1 || M > kGemvMaxRows) {
    FailValue(op, "a has " + std::to_string(M) + " rows: this kernel takes 1 to " + std::to_string(kGemvMaxRows));
  }
  if (K % 8) FailValue(op, "K = " + std::to_string(K) + " must be a multiple of 8 (16-byte loads)");
  if (bias.shape()[0] != N) FailValue(op, "bias has shape " + ShapeStr(bias) + " but N = " + std::to_string(N));
  CheckRows(op, y, M, N, "a " + ShapeStr(a) + " and w " + ShapeStr(w));
  if (N >= (int64_t(1) << 31) / kGemvWarps || K >= (int64_t(1) << 30)) FailValue(op, "N or K is too large");
  if (z) {
    CheckCudaTensor(op, "z", *z, dev);
    CheckDType(op, "z", *z, out_dtype);
    if (z->numel() != y.numel()) FailValue(op, "z has shape " + ShapeStr(*z) + " but y has " + ShapeStr(y));
  }
  if (PtrAlign(DataPtr(a)) < 16 || PtrAlign(DataPtr(w)) < 16) FailValue(op, "a and w must start 16-byte aligned");
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(w)) FailValue(op, "y must not alias a or w");
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  const int s = GemvSplits(N, K, SmCount());
  const void* zp = z ? DataPtr(*z) : nullptr;
  if (dtype == kF16 && out_dtype == kF32) {
    LaunchGemv<__half, float>(int(M), s, DataPtr(a), DataPtr(w), DataPtr(bias), zp, DataPtr(y), int(N), int(K), act,
                              stream);
  } else if (dtype == kF16) {
    LaunchGemv<__half, __half>(int(M), s, DataPtr(a), DataPtr(w), DataPtr(bias), zp, DataPtr(y), int(N), int(K), act,
                               stream);
  } else if (out_dtype == kF32) {
    LaunchGemv<__nv_bfloat16, float>(int(M), s, DataPtr(a), DataPtr(w), DataPtr(bias), zp, DataPtr(y), int(N),
                                     int(K), act, stream);
  } else {
    LaunchGemv<__nv_bfloat16, __nv_bfloat16>(int(M), s, DataPtr(a), DataPtr(w), DataPtr(bias), zp, DataPtr(y),
                                             int(N), int(K), act, stream);
  }
  CheckCuda(cudaGetLastError(), op, "GEMV kernel launch");
}

void Gemv(TensorView a, TensorView w, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  RunGemv(kGemv, a, w, bias, nullptr, attrs, y, workspace);
}

void GemvAdd(TensorView a, TensorView w, TensorView bias, TensorView z, Shape attrs, TensorView y,
             TensorView workspace) {
  RunGemv(kGemvAdd, a, w, bias, &z, attrs, y, workspace);
}

__attribute__((constructor)) void RegisterGemv() {
  try {
    Register(kGemv, Gemv);
    Register(kGemvAdd, GemvAdd);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
