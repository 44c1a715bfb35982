// Our GEMV's kernels (gemv.cu describes them and registers its calls) and their launch, shared by the units that
// instantiate them for one weight dtype each (gemv_f16.cu, gemv_bf16.cu: they compile side by side, where one unit of
// both was among the extension's slowest device units).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "common.h"

namespace nimble_vendor {

constexpr int kGemvWarps = 8, kGemvThreads = kGemvWarps * 32, kGemvMaxRows = 8, kGemvUnroll = 4;
// 1 to 4 rows: a kernel for each count; 5 to 8: the 8-row kernel, the rows past p.rows skipped
constexpr int kGemvExactRows = 4;
constexpr int kMmaCols = 16, kMmaK = 32, kMmaUnroll = 4;  // the tensor-core kernel: a warp's columns, k a step
constexpr int kNormMaxK = 4096, kNormPerThread = kNormMaxK / kGemvThreads;  // the normalized row: shared memory
enum NormKind : int { kNoNorm = 0, kLayerNorm = 1, kRmsNorm = 2 };
enum GluKind : int { kNoGlu = 0, kSiluGlu = 1 };

// The norm of the prologue (norm_matmul): x float32 (x_f32) or w's dtype; gamma and beta float32
struct GemvNorm {
  const void* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  int kind = kNoNorm, x_f32 = 0;
  float eps = 0.0f;
};

struct GemvArgs {
  const void* a;  // null with a norm: the prologue's rows are a
  const void* w;
  const void* bias;
  const void* z;  // null: no residual
  void* y;
  int N, K, act;
  GemvNorm norm;
  int glu = kNoGlu;  // y has N / 2 columns: the gate of each pair of w's rows (see the header)
  int rows = 1;  // a's rows (M); the 8-row kernel's guard
};

// The kernels for w of one dtype (gemv_f16.cu: __half, gemv_bf16.cu: __nv_bfloat16) on M rows of a, y in w's dtype
// or float32 (out_f32), on `stream`: the launch's error.
cudaError_t LaunchGemvF16(int M, int most, const GemvArgs& p, bool out_f32, cudaStream_t stream);
cudaError_t LaunchGemvBF16(int M, int most, const GemvArgs& p, bool out_f32, cudaStream_t stream);

namespace {

// The sum of `v` over the block; `red` holds kGemvWarps floats (each call its own, or a barrier between)
__device__ __forceinline__ float BlockSum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kGemvWarps; ++i) total += red[i];
  return total;
}

// x's one row normalized into xs[0 .. K) (rounded to T, as the unfused norm's output is)
template <typename T>
__device__ __forceinline__ void NormRow(const GemvNorm& n, int K, T* xs) {
  __shared__ float red[2][kGemvWarps];
  float v[kNormPerThread], sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const int c = threadIdx.x + i * kGemvThreads;
    v[i] = c >= K ? 0.0f : n.x_f32 ? static_cast<const float*>(n.x)[c] : ToF(static_cast<const T*>(n.x)[c]);
    sum += v[i];
  }
  // LayerNorm: the centred sum of squares, as PyTorch's kernel computes it (no cancellation); RMSNorm: mean 0
  const float mean = n.kind == kLayerNorm ? BlockSum(sum, red[0]) / float(K) : 0.0f;
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const float d = threadIdx.x + i * kGemvThreads < K ? v[i] - mean : 0.0f;
    sq += d * d;
  }
  const float rstd = rsqrtf(BlockSum(sq, red[1]) / float(K) + n.eps);
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const int c = threadIdx.x + i * kGemvThreads;
    if (c < K) {
      const float b = n.kind == kLayerNorm ? n.beta[c] : 0.0f;
      xs[c] = FromF<T>((v[i] - mean) * rstd * n.gamma[c] + b);
    }
  }
  __syncthreads();
}

// grid.x: column groups of kGemvWarps / S columns; S warps of a block share a column, each a K slice. kGlu: the block's
// columns pair up (gate, up) in its epilogue, which writes one gated column a pair.
template <typename T, typename O, int M, int S, bool kNorm, bool kGlu = false>
__global__ void __launch_bounds__(kGemvThreads) GemvKernel(GemvArgs p) {
  constexpr int kCols = kGemvWarps / S;
  __shared__ float partial[kGemvWarps][M];
  __shared__ float gated[kGlu ? kCols : 1];
  static_assert(!kNorm || M == 1, "the norm's prologue takes one row");
  static_assert(!kGlu || (M == 1 && kCols % 2 == 0), "the gate takes one row and pairs of a block's columns");
  __shared__ __align__(16) T xs[kNorm ? kNormMaxK : 8];
  const T* __restrict__ w = static_cast<const T*>(p.w);
  const int N = p.N, K = p.K;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = blockIdx.x * kCols + warp / S, slice = warp % S;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  const int vecs = col < N ? K / 8 : 0;  // 16-byte vectors in the column's row of w
  const uint4* wr = reinterpret_cast<const uint4*>(w + int64_t(col < N ? col : 0) * K);
  const int first = slice * 32 + lane, step = S * 32;
  // The lane's first kGemvUnroll weight vectors (at a decode step's sizes, all it reads) are loaded before the wait:
  // weights are constants, so under programmatic dependent launch their reads overlap the kernel before this one.
  uint4 wv[kGemvUnroll];
#pragma unroll
  for (int u = 0; u < kGemvUnroll; ++u) {
    const int at = first + u * step;
    wv[u] = at < vecs ? __ldg(wr + at) : make_uint4(0, 0, 0, 0);
  }
  GridLaunchDependents();
  GridDependencyWait();  // a, x and z are the kernels' before this one; y may be a buffer they still read
  if constexpr (kNorm) NormRow<T>(p.norm, K, xs);
  const uint4* a = reinterpret_cast<const uint4*>(kNorm ? static_cast<const void*>(xs) : p.a);
  for (int v = first; v < vecs; v += kGemvUnroll * step) {
    uint4 cur[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {  // the next kGemvUnroll vectors' loads in flight during this arithmetic
      const int next = v + (kGemvUnroll + u) * step;
      cur[u] = wv[u];
      wv[u] = next < vecs ? __ldg(wr + next) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int at = v + u * step;
      if (at >= vecs) break;
      float wf[8];
      Unpack16B<T>(cur[u], wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        if (M > kGemvExactRows && m >= p.rows) continue;  // the 8-row kernel's rows past a's
        float af[8];
        Unpack16B<T>(kNorm ? a[m * (K / 8) + at] : __ldg(a + m * (K / 8) + at), af);
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
  if (col < N && slice == 0 && lane < (M > kGemvExactRows ? p.rows : M)) {
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
    const O* z = static_cast<const O*>(p.z);
    const float before = sum + ToF(static_cast<const O*>(p.bias)[col]) + (z != nullptr ? ToF(z[at]) : 0.0f);
    if constexpr (kGlu) {
      gated[warp / S] = ToF(FromF<O>(before));  // the projection's output, rounded as the model's is
    } else {
      static_cast<O*>(p.y)[at] = FromF<O>(Activate(before, p.act));
    }
  }
  if constexpr (kGlu) {  // thread j of the block: its pair j, y[col / 2] = silu(gate) * up, rounded as the ops round
    __syncthreads();
    const int pair = threadIdx.x, first = blockIdx.x * kCols + 2 * pair;
    if (pair < kCols / 2 && first + 1 < N) {
      const float g = gated[2 * pair], u = gated[2 * pair + 1];
      const float sig = ToF(FromF<O>(1.0f / (1.0f + expf(-g))));
      const float silu = ToF(FromF<O>(g * sig));
      static_cast<O*>(p.y)[first / 2] = FromF<O>(silu * u);
    }
  }
}

// D += A (16 x 16, row-major) * B (16 x 8, column-major) on the tensor cores, float32 accumulation (sm_80+)
template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the host launches this kernel on sm_80+ only (GemvMmaRows)
#endif
}

// The tensor-core kernel for 2..8 rows (see the header). Lane (g, t) = (lane / 4, lane % 4) of a warp loads, at step i
// (k in [32 i, 32 i + 32)), the 16 bytes at k = 32 i + 8 t of w's rows n0 + g and n0 + g + 8 and of a's row g; its two
// MMAs take halves 0-3 and 4-7 of them. Its accumulators are y[2t, n0 + g], y[2t + 1, n0 + g] and the same of column
// n0 + g + 8. grid.x: groups of kGemvWarps / S tiles of 16 columns.
template <typename T, typename O, int S>
__global__ void __launch_bounds__(kGemvThreads) GemvMmaKernel(GemvArgs p) {
  constexpr int kTiles = kGemvWarps / S;
  __shared__ float partial[S > 1 ? kGemvWarps : 1][4][32];
  const T* __restrict__ w = static_cast<const T*>(p.w);
  const int N = p.N, K = p.K, rows = p.rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int n0 = (blockIdx.x * kTiles + warp / S) * kMmaCols, slice = warp % S;
  const int steps = n0 < N ? (K + kMmaK - 1) / kMmaK : 0;
  // w's rows past N read row N - 1 (in bounds; their sums are not written)
  const uint4* w0 = reinterpret_cast<const uint4*>(w + int64_t(min(n0 + g, N - 1)) * K + 8 * t);
  const uint4* w1 = reinterpret_cast<const uint4*>(w + int64_t(min(n0 + g + 8, N - 1)) * K + 8 * t);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto in = [&](int i) { return i < steps && kMmaK * i + 8 * t < K; };  // the lane's vector of step i is in K
  uint4 wa[kMmaUnroll], wb[kMmaUnroll];
#pragma unroll
  for (int u = 0; u < kMmaUnroll; ++u) {  // weights before the wait, as the CUDA-core kernel's
    const int i = slice + u * S;
    wa[u] = in(i) ? __ldg(w0 + 4 * i) : zero;
    wb[u] = in(i) ? __ldg(w1 + 4 * i) : zero;
  }
  GridLaunchDependents();
  GridDependencyWait();
  const uint4* a = reinterpret_cast<const uint4*>(static_cast<const T*>(p.a) + int64_t(min(g, rows - 1)) * K +
                                                  8 * t);
  const bool row_in = g < rows;  // B's columns past a's rows are zeros
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i0 = slice; i0 < steps; i0 += kMmaUnroll * S) {
    uint4 ca[kMmaUnroll], cb[kMmaUnroll], x[kMmaUnroll];
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int i = i0 + u * S, next = i0 + (kMmaUnroll + u) * S;
      ca[u] = wa[u];
      cb[u] = wb[u];
      x[u] = row_in && in(i) ? __ldg(a + 4 * i) : zero;
      wa[u] = in(next) ? __ldg(w0 + 4 * next) : zero;
      wb[u] = in(next) ? __ldg(w1 + 4 * next) : zero;
    }
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      if (i0 + u * S >= steps) break;
      Mma16816<T>(d, ca[u].x, cb[u].x, ca[u].y, cb[u].y, x[u].x, x[u].y);
      Mma16816<T>(d, ca[u].z, cb[u].z, ca[u].w, cb[u].w, x[u].z, x[u].w);
    }
  }
  if constexpr (S > 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) partial[warp][j][lane] = d[j];
    __syncthreads();
    if (slice == 0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        d[j] = 0.0f;
        for (int s = 0; s < S; ++s) d[j] += partial[warp + s][j][lane];
      }
    }
  }
  if (slice != 0) return;
  const O* z = static_cast<const O*>(p.z);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int col = n0 + g + (j >= 2 ? 8 : 0), row = 2 * t + (j & 1);
    if (col >= N || row >= rows) continue;
    const int64_t at = int64_t(row) * N + col;
    const float v = d[j] + ToF(static_cast<const O*>(p.bias)[col]) + (z != nullptr ? ToF(z[at]) : 0.0f);
    static_cast<O*>(p.y)[at] = FromF<O>(Activate(v, p.act));
  }
}

// S: warps a column (1, 2, 4 or 8; at most `most`), by NIMBLE_GEMV_BLOCKS_PER_SM = B (read once a process):
// - B > 0 (default 4, one wave): the fewest S whose lanes load all their vectors before the wait (kGemvUnroll each;
//   see the kernel), halved while the grid exceeds what the cores hold at once -- `resident(S)` blocks a core (the
//   kernel's occupancy: 4 at one or two rows, 2-3 at more, by their registers), at most B -- then doubled while the
//   grid has fewer blocks than the GPU has cores (each slice keeping a vector a lane). Every block resident at
//   once: none waits for a second wave, and the loads of all of them are in flight together;
// - 0, fill (the policy before): the fewest S whose grid reaches four warps a core's slot (kGemvWarps x SMs x 4),
//   keeping at least one 16-byte vector a lane of each slice -- up to two waves of blocks at a decode step's sizes.
// The A/B switch of scripts/experiments/gemv_check.py (benchmarks/findings.md, 'One wave of GEMV blocks').
int GemvBlocksPerSm() {
  static const int blocks = [] {
    const char* env = std::getenv("NIMBLE_GEMV_BLOCKS_PER_SM");
    const int b = env != nullptr && *env != '\0' ? std::atoi(env) : 4;
    return b > 0 && b <= 8 ? b : 0;
  }();
  return blocks;
}

// N: the warps' units (columns; the tensor-core kernel's 16-column tiles), vecs: a unit's steps of one vector a lane
// (K / 8 columns' vectors; the tensor-core kernel: 32 a step of 32 k, the same 16 bytes a lane)
template <typename Resident>
int GemvSplits(int64_t N, int64_t vecs, int64_t sms, int most, Resident resident) {
  const int per_sm = GemvBlocksPerSm();
  int s = 1;
  if (per_sm == 0) {
    const int64_t want = sms * kGemvWarps * 4;
    while (s < most && N * s < want && vecs >= int64_t(2 * s) * 32) s *= 2;
    return s;
  }
  auto blocks = [&](int splits) { return (N * splits + kGemvWarps - 1) / kGemvWarps; };
  while (s < most && vecs > int64_t(s) * 32 * kGemvUnroll) s *= 2;
  while (s > 1 && blocks(s) > sms * std::min(per_sm, std::max(1, resident(s)))) s /= 2;
  while (s < most && blocks(s) < sms && vecs >= int64_t(2 * s) * 32) s *= 2;
  return s;
}

using GemvFn = void (*)(GemvArgs);

// The kernel for p's call with S warps a column: the norm's prologue and the gate take one row (RunGemv refuses more)
template <typename T, typename O, int M, int S>
GemvFn GemvKernelFor(const GemvArgs& p) {
  if constexpr (M == 1) {
    if constexpr (S < kGemvWarps && std::is_same_v<T, O>) {  // the gate: a block's columns in pairs, y in w's dtype
      if (p.glu != kNoGlu) {
        return p.norm.kind != kNoNorm ? GemvKernel<T, O, 1, S, true, true> : GemvKernel<T, O, 1, S, false, true>;
      }
    }
    if (p.norm.kind != kNoNorm) return GemvKernel<T, O, 1, S, true>;
  }
  return GemvKernel<T, O, M, S, false>;
}

// Blocks of `kernel` a core holds at once (0 when CUDA cannot say), asked once: `known` holds it (-1 before)
int ResidentBlocks(std::atomic<int>& known, const void* kernel) {
  int blocks = known.load(std::memory_order_relaxed);
  if (blocks < 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kGemvThreads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      blocks = 0;
    }
    known.store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

// Blocks of that kernel a core holds at once, asked once a process for each
template <typename T, typename O, int M, int S>
int GemvResident(const GemvArgs& p) {
  static std::atomic<int> known[4] = {-1, -1, -1, -1};  // by variant: plain, norm, gate, norm and gate
  const int variant = (p.norm.kind != kNoNorm ? 1 : 0) + (p.glu != kNoGlu ? 2 : 0);
  return ResidentBlocks(known[variant], reinterpret_cast<const void*>(GemvKernelFor<T, O, M, S>(p)));
}

// f(std::integral_constant<int, S>{}) for the split count s (1, 2, 4 or 8, as GemvSplits chooses): the one place a
// count chosen at run time becomes a kernel's template argument
template <typename F>
auto WithSplits(int s, F&& f) {
  switch (s) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

template <typename T, typename O, int M, int S>
cudaError_t LaunchGemvS(const GemvArgs& p, cudaStream_t stream) {
  constexpr int cols = kGemvWarps / S;
  KernelLaunch launch(dim3(unsigned((p.N + cols - 1) / cols)), dim3(kGemvThreads), stream);
  launch.Pdl();
  return launch(GemvKernelFor<T, O, M, S>(p), p);
}

// Splits chosen for this kernel family (`most`: the gate's column pairs take at most half the warps), then launched
template <typename T, typename O, int M>
cudaError_t LaunchGemvM(const GemvArgs& p, int most, cudaStream_t stream) {
  auto resident = [&](int s) {
    return WithSplits(s, [&](auto S) { return GemvResident<T, O, M, decltype(S)::value>(p); });
  };
  const int s = GemvSplits(p.N, p.K / 8, SmCount(), most, resident);
  return WithSplits(s, [&](auto S) { return LaunchGemvS<T, O, M, decltype(S)::value>(p, stream); });
}

// The tensor-core kernel, S warps a tile, and the blocks of it a core holds (asked once a process)
template <typename T, typename O, int S>
cudaError_t LaunchGemvMmaS(const GemvArgs& p, cudaStream_t stream) {
  constexpr int tiles = kGemvWarps / S;
  const int64_t units = (p.N + kMmaCols - 1) / kMmaCols;
  KernelLaunch launch(dim3(unsigned((units + tiles - 1) / tiles)), dim3(kGemvThreads), stream);
  launch.Pdl();
  return launch(GemvMmaKernel<T, O, S>, p);
}

template <typename T, typename O, int S>
int GemvMmaResident() {
  static std::atomic<int> known{-1};
  return ResidentBlocks(known, reinterpret_cast<const void*>(GemvMmaKernel<T, O, S>));
}

template <typename T, typename O>
cudaError_t LaunchGemvMma(const GemvArgs& p, cudaStream_t stream) {
  auto resident = [](int s) { return WithSplits(s, [](auto S) { return GemvMmaResident<T, O, decltype(S)::value>(); }); };
  const int64_t units = (p.N + kMmaCols - 1) / kMmaCols, steps = (p.K + kMmaK - 1) / kMmaK;
  const int s = GemvSplits(units, steps * 32, SmCount(), kGemvWarps, resident);
  return WithSplits(s, [&](auto S) { return LaunchGemvMmaS<T, O, decltype(S)::value>(p, stream); });
}

// The fewest rows the tensor-core kernel takes (NIMBLE_GEMV_MMA_ROWS, read once a process: 2 to 8, default 5; 9 or
// more never), where the device has the m16n8k16 MMA (sm_80+); else 9
int GemvMmaRows() {
  static const int rows = [] {
    const char* env = std::getenv("NIMBLE_GEMV_MMA_ROWS");
    const int r = env != nullptr && *env != '\0' ? std::atoi(env) : 5;
    return DeviceAttribute<cudaDevAttrComputeCapabilityMajor>(0) >= 8 ? std::max(2, r) : kGemvMaxRows + 1;
  }();
  return rows;
}

template <typename T, typename O>
cudaError_t LaunchGemv(int M, int most, const GemvArgs& p, cudaStream_t stream) {
  if (M >= GemvMmaRows() && p.norm.kind == kNoNorm && p.glu == kNoGlu) return LaunchGemvMma<T, O>(p, stream);
  if (M == 1) return LaunchGemvM<T, O, 1>(p, most, stream);
  if (M == 2) return LaunchGemvM<T, O, 2>(p, most, stream);
  if (M == 3) return LaunchGemvM<T, O, 3>(p, most, stream);
  if (M == 4) return LaunchGemvM<T, O, 4>(p, most, stream);
  return LaunchGemvM<T, O, kGemvMaxRows>(p, most, stream);  // 5 to 8 rows
}

}  // namespace
}  // namespace nimble_vendor
