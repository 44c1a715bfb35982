// The kernels of our fp32 GEMM (gemm_simt.cu: the candidates, the calls and their registration): the arguments,
// the tile variants, the epilogue, the split-K reduction across a thread-block cluster, and two main loops
// (registers-staged, and a cp.async pipeline), each a template over its tile, instantiated in a unit each
// (gemm_simt_staged.cu, gemm_simt_pipelined.cu: they compile side by side).
#pragma once

#include <cooperative_groups.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common.h"

namespace nimble_vendor {

constexpr int kBK = 16;        // K columns per shared-memory stage
// The activations the epilogue compiles: 0-3, not GELU's tanh form (4). Its branch, never taken by the fp32 GEMMs
// here (GPT-2's tanh GELU is cuBLASLt's epilogue or the GEMV's), made every tile's main loop 2-7% slower on an H200
// (benchmarks/findings.md, 'The SIMT GEMM without the tanh GELU').
constexpr int kSimtMaxActivation = 3;

struct SimtArgs {
  const float* a;     // [M, K]
  const float* b;     // [K, N]
  const float* bias;  // [N]
  const float* z;     // [M, N] or null
  float* y;           // [M, N]
  int M, N, K;
  int k_chunk;  // K columns per split (a multiple of kBK)
  int act;
};

// A tile variant of the candidates: a block computes BM x BN outputs, a thread TM x TN; the cp.async kernel's
// (pipelined) stages hold BK columns of K, ST of them (the registers-staged kernel: kBK, two)
struct SimtShape {
  int bm, bn, tm, tn;
  bool pipelined;
  int bk, st;
};

// New variants go at the end: an index baked into an artifact must keep meaning the same kernel.
constexpr SimtShape kSimtShapes[] = {
    {64, 64, 4, 4, false, kBK, 2},  {32, 64, 4, 4, false, kBK, 2},  {64, 32, 4, 4, false, kBK, 2},
    {64, 128, 8, 8, false, kBK, 2}, {32, 128, 4, 8, false, kBK, 2}, {128, 64, 8, 4, false, kBK, 2},
    {64, 64, 4, 4, true, 16, 3},    {64, 128, 4, 8, true, 16, 3},   {128, 64, 8, 4, true, 16, 3},
    {128, 128, 8, 8, true, 16, 3},  {32, 128, 4, 8, true, 16, 3},
    // deeper: 32 columns of K a stage, four stages (more bytes in flight per block, for weights that come from
    // HBM rather than L2: ViT-B's GEMMs inside the model ran slower than back to back)
    {32, 128, 4, 8, true, 32, 4},   {64, 128, 4, 8, true, 32, 4},   {32, 64, 4, 4, true, 32, 4},
};
constexpr int kSimtVariantCount = int(sizeof(kSimtShapes) / sizeof(kSimtShapes[0]));

// Variant `variant` (an index of kSimtShapes) with K split `splits` ways across a cluster, on `stream`: the
// registers-staged kernels' unit (gemm_simt_staged.cu) and the cp.async kernels' (gemm_simt_pipelined.cu); another
// unit's variant is cudaErrorInvalidValue
cudaError_t LaunchSimtStaged(int variant, const SimtArgs& p, int splits, cudaStream_t stream);
cudaError_t LaunchSimtPipelined(int variant, const SimtArgs& p, int splits, cudaStream_t stream);

namespace {

namespace cg = cooperative_groups;

// y[gm, gn..gn+3] = act(v + bias + z) (gn + 3 < N: N is a multiple of 4)
__device__ __forceinline__ void Epilogue(const SimtArgs& p, int gm, int gn, float4 v) {
  const float4 bb = *reinterpret_cast<const float4*>(p.bias + gn);
  v.x += bb.x, v.y += bb.y, v.z += bb.z, v.w += bb.w;
  const size_t at = size_t(gm) * p.N + gn;
  if (p.z) {
    const float4 zz = *reinterpret_cast<const float4*>(p.z + at);
    v.x += zz.x, v.y += zz.y, v.z += zz.z, v.w += zz.w;
  }
  constexpr int kMax = kSimtMaxActivation;
  v = make_float4(Activate<kMax>(v.x, p.act), Activate<kMax>(v.y, p.act), Activate<kMax>(v.z, p.act),
                  Activate<kMax>(v.w, p.act));
  *reinterpret_cast<float4*>(p.y + at) = v;
}

// One tile variant: a block computes BM x BN outputs, a thread TM x TN of them as RM x RN groups of 4 x 4, the
// groups BM / RM rows (BN / RN columns) apart, so that a warp's shared-memory reads of a k step are contiguous
// float4s.
template <int BM, int BN, int TM, int TN>
struct SimtTile {
  static constexpr int kThreads = (BM / TM) * (BN / TN);
  static constexpr int kColThreads = BN / TN;
  static constexpr int RM = TM / 4, RN = TN / 4;
  static constexpr int kAStride = BM + 4;  // As[k][m]: rows 16-byte aligned
  static constexpr int kALoads = BM * kBK / 4 / kThreads;  // float4s of a's tile per thread
  static constexpr int kBLoads = kBK * BN / 4 / kThreads;
  static constexpr int kStageFloats = 2 * kBK * kAStride + 2 * kBK * BN;  // two stages of As and Bs
  static constexpr int kSmemFloats = kStageFloats > BM * BN ? kStageFloats : BM * BN;  // or one partial tile
  static_assert(TM % 4 == 0 && TN % 4 == 0 && kALoads >= 1 && kBLoads >= 1, "tile shape");
  static_assert(BM * kBK / 4 % kThreads == 0 && kBK * BN / 4 % kThreads == 0, "loads per thread");
  static_assert(kSmemFloats * 4 <= 48 * 1024, "static shared memory");
};

// The block's accumulators (thread (tx, ty) of the SimtTile mapping holds rows row(i), columns col(r)..+3) into
// y through the epilogue; with K split across a cluster (gridDim.z > 1), first summed across the cluster's blocks
// through their shared memory. `smem` must hold BM x BN floats and be free (every thread past its last read).
template <int BM, int BN, int TM, int TN, int kThreads>
__device__ __forceinline__ void FinishTile(const SimtArgs& p, const float (&acc)[TM][TN], float* smem, int m0, int n0,
                                           int tid) {
  constexpr int RM = TM / 4, RN = TN / 4, kColThreads = BN / TN;
  const int tx = tid % kColThreads, ty = tid / kColThreads;
  auto row = [&](int i) { return (i / 4) * (BM / RM) + ty * 4 + i % 4; };
  auto col = [&](int r) { return r * (BN / RN) + tx * 4; };
  if (gridDim.z == 1) {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int gm = m0 + row(i);
#pragma unroll
      for (int r = 0; r < RN; ++r) {
        const int gn = n0 + col(r);
        if (gm < p.M && gn < p.N) {
          Epilogue(p, gm, gn, make_float4(acc[i][r * 4], acc[i][r * 4 + 1], acc[i][r * 4 + 2], acc[i][r * 4 + 3]));
        }
      }
    }
    return;
  }
#if __CUDA_ARCH__ >= 900
  float* partial = smem;  // [BM][BN]
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int r = 0; r < RN; ++r) {
      *reinterpret_cast<float4*>(partial + row(i) * BN + col(r)) =
          make_float4(acc[i][r * 4], acc[i][r * 4 + 1], acc[i][r * 4 + 2], acc[i][r * 4 + 3]);
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int splits = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  constexpr int kChunks = BM * BN / 4;
  const int c_end = (rank + 1) * kChunks / splits;
  for (int c = rank * kChunks / splits + tid; c < c_end; c += kThreads) {
    const int gm = m0 + c / (BN / 4), gn = n0 + c % (BN / 4) * 4;
    if (gm >= p.M || gn >= p.N) continue;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {  // the same order in every block: deterministic
      const float4 v = *reinterpret_cast<const float4*>(cluster.map_shared_rank(partial, q) + c * 4);
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    Epilogue(p, gm, gn, s);
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
#else
  __trap();  // split K needs thread-block clusters; the host lists no split candidate below sm_90
#endif
}

template <int BM, int BN, int TM, int TN>
__global__ void __launch_bounds__(SimtTile<BM, BN, TM, TN>::kThreads) SimtGemmKernel(SimtArgs p) {
  using T = SimtTile<BM, BN, TM, TN>;
  __shared__ __align__(16) float smem[T::kSmemFloats];
  float* As = smem;                          // [2][kBK][kAStride], a's tile transposed
  float* Bs = smem + 2 * kBK * T::kAStride;  // [2][kBK][BN]
  const int tid = threadIdx.x, tx = tid % T::kColThreads, ty = tid / T::kColThreads;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * p.k_chunk, k_end = min(p.K, k_begin + p.k_chunk);

  float4 ra[T::kALoads], rb[T::kBLoads];
  auto load = [&](int k0) {  // global -> registers (zeros outside the matrices and this split's K)
#pragma unroll
    for (int i = 0; i < T::kALoads; ++i) {
      const int f = tid + i * T::kThreads, m = f / (kBK / 4), k = f % (kBK / 4) * 4;
      const int gm = m0 + m, gk = k0 + k;
      ra[i] = gm < p.M && gk < k_end ? __ldg(reinterpret_cast<const float4*>(p.a + size_t(gm) * p.K + gk))
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < T::kBLoads; ++i) {
      const int f = tid + i * T::kThreads, k = f / (BN / 4), n = f % (BN / 4) * 4;
      const int gk = k0 + k, gn = n0 + n;
      rb[i] = gk < k_end && gn < p.N ? __ldg(reinterpret_cast<const float4*>(p.b + size_t(gk) * p.N + gn))
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  auto store = [&](int stage) {  // registers -> shared memory (a transposed)
    float* as = As + stage * kBK * T::kAStride;
    float* bs = Bs + stage * kBK * BN;
#pragma unroll
    for (int i = 0; i < T::kALoads; ++i) {
      const int f = tid + i * T::kThreads, m = f / (kBK / 4), k = f % (kBK / 4) * 4;
      as[(k + 0) * T::kAStride + m] = ra[i].x;
      as[(k + 1) * T::kAStride + m] = ra[i].y;
      as[(k + 2) * T::kAStride + m] = ra[i].z;
      as[(k + 3) * T::kAStride + m] = ra[i].w;
    }
#pragma unroll
    for (int i = 0; i < T::kBLoads; ++i) {
      const int f = tid + i * T::kThreads, k = f / (BN / 4), n = f % (BN / 4) * 4;
      *reinterpret_cast<float4*>(bs + k * BN + n) = rb[i];
    }
  };

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  }
  load(k_begin);
  store(0);
  __syncthreads();
  int stage = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += kBK) {
    const bool more = k0 + kBK < k_end;
    if (more) load(k0 + kBK);  // in flight while this stage is multiplied
    const float* as = As + stage * kBK * T::kAStride;
    const float* bs = Bs + stage * kBK * BN;
#pragma unroll
    for (int k = 0; k < kBK; ++k) {
      float av[TM], bv[TN];
#pragma unroll
      for (int r = 0; r < T::RM; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(as + k * T::kAStride + r * (BM / T::RM) + ty * 4);
        av[r * 4 + 0] = v.x, av[r * 4 + 1] = v.y, av[r * 4 + 2] = v.z, av[r * 4 + 3] = v.w;
      }
#pragma unroll
      for (int r = 0; r < T::RN; ++r) {
        const float4 v = *reinterpret_cast<const float4*>(bs + k * BN + r * (BN / T::RN) + tx * 4);
        bv[r * 4 + 0] = v.x, bv[r * 4 + 1] = v.y, bv[r * 4 + 2] = v.z, bv[r * 4 + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < TM; ++i) {
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    if (more) store(stage ^ 1);  // the other stage was last read before the previous barrier
    __syncthreads();
    stage ^= 1;
  }

  FinishTile<BM, BN, TM, TN, T::kThreads>(p, acc, smem, m0, n0, tid);
}

template <int BM, int BN, int TM, int TN>
cudaError_t LaunchSimt(const SimtArgs& p, int splits, cudaStream_t stream) {
  const dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM), unsigned(splits));
  return KernelLaunch(grid, dim3(SimtTile<BM, BN, TM, TN>::kThreads), stream)
      .Cluster(1, 1, unsigned(splits))(SimtGemmKernel<BM, BN, TM, TN>, p);
}

// ---- the pipelined kernel: cp.async copies into a ring of ST shared-memory stages of BK columns of K ----
// The same tiles, thread mapping, epilogue and cluster split-K as SimtGemmKernel, but global memory goes straight to
// shared memory (cp.async, 16 bytes a copy, no register staging), ST - 1 stages ahead of the multiply, and a
// stays row-major there ([BM][BK + 4]), read as float4s along k: each float4 serves 4 k steps. For the larger tiles,
// whose fewer blocks must each hide more memory latency (ViT-B's and BERT's GEMMs).

template <int BM, int BN, int TM, int TN, int BK, int ST>
struct AsyncTile {
  static constexpr int kThreads = (BM / TM) * (BN / TN);
  static constexpr int kColThreads = BN / TN;
  static constexpr int RM = TM / 4, RN = TN / 4;
  static constexpr int kAStride = BK + 4;  // As[m][k]: rows 16-byte aligned, 2 rows of a warp 16 banks apart
  static constexpr int kStageFloats = BM * kAStride + BK * BN;
  static constexpr int kALoads = BM * BK / 4 / kThreads;
  static constexpr int kBLoads = BK * BN / 4 / kThreads;
  static constexpr int kSmemFloats = ST * kStageFloats > BM * BN ? ST * kStageFloats : BM * BN;
  static_assert(TM % 4 == 0 && TN % 4 == 0 && kALoads >= 1 && kBLoads >= 1, "tile shape");
  static_assert(BM * BK / 4 % kThreads == 0 && BK * BN / 4 % kThreads == 0, "loads per thread");
};

template <int BM, int BN, int TM, int TN, int BK, int ST>
// (two blocks an SM at least: 128 x 128 would take 130 registers a thread, one block of 256 threads an SM)
__global__ void __launch_bounds__(AsyncTile<BM, BN, TM, TN, BK, ST>::kThreads, 2) SimtGemmAsyncKernel(SimtArgs p) {
  using T = AsyncTile<BM, BN, TM, TN, BK, ST>;
  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x, tx = tid % T::kColThreads, ty = tid / T::kColThreads;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * p.k_chunk, k_end = min(p.K, k_begin + p.k_chunk);
  const int tiles = (k_end - k_begin + BK - 1) / BK;

  auto issue = [&](int stage, int k0) {  // one stage's copies, global -> shared (zeros outside)
    float* as = smem + stage * T::kStageFloats;
    float* bs = as + BM * T::kAStride;
#pragma unroll
    for (int i = 0; i < T::kALoads; ++i) {
      const int f = tid + i * T::kThreads, m = f / (BK / 4), k = f % (BK / 4) * 4;
      const int gm = m0 + m, gk = k0 + k;
      const bool ok = gm < p.M && gk < k_end;
      CpAsync16(as + m * T::kAStride + k, ok ? p.a + size_t(gm) * p.K + gk : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < T::kBLoads; ++i) {
      const int f = tid + i * T::kThreads, k = f / (BN / 4), n = f % (BN / 4) * 4;
      const int gk = k0 + k, gn = n0 + n;
      const bool ok = gk < k_end && gn < p.N;
      CpAsync16(bs + k * BN + n, ok ? p.b + size_t(gk) * p.N + gn : p.b, ok);
    }
  };

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  }
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {  // the pipeline's head; a group per stage, empty ones too
    if (s < tiles) issue(s, k_begin + s * BK);
    CpAsyncCommit();
  }
  for (int t = 0; t < tiles; ++t) {
    CpAsyncWait<ST - 2>();  // tile t has landed (for this thread's copies) ...
    __syncthreads();             // ... and for everyone's; and everyone is done with tile t - 1's stage
    if (t + ST - 1 < tiles) issue((t + ST - 1) % ST, k_begin + (t + ST - 1) * BK);
    CpAsyncCommit();
    const float* as = smem + (t % ST) * T::kStageFloats;
    const float* bs = as + BM * T::kAStride;
#pragma unroll
    for (int k4 = 0; k4 < BK; k4 += 4) {
      float4 av[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) {
        av[i] = *reinterpret_cast<const float4*>(as + ((i / 4) * (BM / T::RM) + ty * 4 + i % 4) * T::kAStride + k4);
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        float bv[TN];
#pragma unroll
        for (int r = 0; r < T::RN; ++r) {
          const float4 v = *reinterpret_cast<const float4*>(bs + (k4 + kk) * BN + r * (BN / T::RN) + tx * 4);
          bv[r * 4 + 0] = v.x, bv[r * 4 + 1] = v.y, bv[r * 4 + 2] = v.z, bv[r * 4 + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          const float a = kk == 0 ? av[i].x : kk == 1 ? av[i].y : kk == 2 ? av[i].z : av[i].w;
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a, bv[j], acc[i][j]);
        }
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // the stages are free for the partial tile
  FinishTile<BM, BN, TM, TN, T::kThreads>(p, acc, smem, m0, n0, tid);
}

template <int BM, int BN, int TM, int TN, int BK, int ST>
cudaError_t LaunchSimtAsync(const SimtArgs& p, int splits, cudaStream_t stream) {
  using T = AsyncTile<BM, BN, TM, TN, BK, ST>;
  constexpr size_t kBytes = size_t(T::kSmemFloats) * sizeof(float);
  static std::atomic<uint64_t> configured{0};  // devices whose attribute is set (per device and instantiation)
  if (kBytes > 48 * 1024) {
    const cudaError_t err = OncePerDevice(configured, [] {
      return cudaFuncSetAttribute(SimtGemmAsyncKernel<BM, BN, TM, TN, BK, ST>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBytes));
    });
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM), unsigned(splits));
  return KernelLaunch(grid, dim3(T::kThreads), stream, kBytes)
      .Cluster(1, 1, unsigned(splits))(SimtGemmAsyncKernel<BM, BN, TM, TN, BK, ST>, p);
}

// Variant I's kernel if it is of the kind kPipelined (else cudaErrorInvalidValue, nothing instantiated)
template <bool kPipelined, std::size_t I>
cudaError_t LaunchSimtShape(const SimtArgs& p, int splits, cudaStream_t stream) {
  constexpr SimtShape s = kSimtShapes[I];
  if constexpr (s.pipelined != kPipelined) {
    return cudaErrorInvalidValue;
  } else if constexpr (kPipelined) {
    return LaunchSimtAsync<s.bm, s.bn, s.tm, s.tn, s.bk, s.st>(p, splits, stream);
  } else {
    return LaunchSimt<s.bm, s.bn, s.tm, s.tn>(p, splits, stream);
  }
}

// Variant v's kernel of the kind kPipelined: the one place a variant's index becomes its kernel's template arguments
template <bool kPipelined, std::size_t... I>
cudaError_t LaunchSimtKind(int v, const SimtArgs& p, int splits, cudaStream_t stream, std::index_sequence<I...>) {
  cudaError_t err = cudaErrorInvalidValue;
  (void)((v == int(I) ? (err = LaunchSimtShape<kPipelined, I>(p, splits, stream), true) : false) || ...);
  return err;
}

}  // namespace
}  // namespace nimble_vendor
