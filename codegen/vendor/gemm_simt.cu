// Our fp32 GEMM for the small M of batch-1 inference (provider simt_gemm):
//   y[M, N] = act(a[M, K] @ b[K, N] + bias[N] (+ z[M, N]))
// exact fp32 on the FMA pipes (no TF32), bias, residual and activation in the epilogue.
//
// Why: at M = 197 (a ViT's tokens) cuBLAS's fp32 kernels use large tiles, so ViT-S's GEMMs make 6-72 output tiles
// for 132 SMs and run at 15-25% of the FMA peak (thirteenth session, gemm_algos.json: ViT-S fc2, 116 MFMA, 17 us).
// Here the tiles are small (32-128 rows and columns, a thread's 4x4 to 8x8 register micro-tile) and K is split
// across the blocks of a thread-block cluster (Hopper): each block reduces its share of K into registers, parks
// its partial tile in shared memory, and after a cluster barrier each block sums one slice of the tile across
// the cluster's shared memories (distributed shared memory, a fixed order: deterministic), adds the epilogue and
// writes y. One launch, no workspace, no atomics, nothing to reset between CUDA-graph replays.
//
// Candidates: a tile variant and a split count each; the list is a function of (M, N, K). attrs [activation] runs
// the fastest, measured on the first call made outside a CUDA graph capture (as the cuDNN convolutions do; under a
// capture, without one, a static rule's pick); attrs [activation, index] runs candidate `index` (the build measures
// them all with nimble.gemm.matmul_timings and bakes the fastest in).
#include <cooperative_groups.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "attention_kernels.h"  // SmCount
#include "common.h"

namespace nimble_vendor {
namespace {

namespace cg = cooperative_groups;

constexpr const char* kSimtMatmul = "nimble.gemm.matmul";
constexpr const char* kSimtMatmulAdd = "nimble.gemm.matmul_add";
constexpr int kBK = 16;        // K columns per shared-memory stage

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

__device__ __forceinline__ float Activate(float v, int act) {
  if (act == 1) return fmaxf(v, 0.0f);
  if (act == 2) return fminf(fmaxf(v, 0.0f), 6.0f);
  if (act == 3) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));  // GELU, erf form
  return v;
}

// y[gm, gn..gn+3] = act(v + bias + z) (gn + 3 < N: N is a multiple of 4)
__device__ __forceinline__ void Epilogue(const SimtArgs& p, int gm, int gn, float4 v) {
  const float4 bb = *reinterpret_cast<const float4*>(p.bias + gn);
  v.x += bb.x, v.y += bb.y, v.z += bb.z, v.w += bb.w;
  const size_t at = size_t(gm) * p.N + gn;
  if (p.z) {
    const float4 zz = *reinterpret_cast<const float4*>(p.z + at);
    v.x += zz.x, v.y += zz.y, v.z += zz.z, v.w += zz.w;
  }
  v = make_float4(Activate(v.x, p.act), Activate(v.y, p.act), Activate(v.z, p.act), Activate(v.w, p.act));
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
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM), unsigned(splits));
  cfg.blockDim = dim3(SimtTile<BM, BN, TM, TN>::kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = 1, cluster[0].val.clusterDim.y = 1, cluster[0].val.clusterDim.z = unsigned(splits);
  cfg.attrs = cluster;
  cfg.numAttrs = splits > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, SimtGemmKernel<BM, BN, TM, TN>, p);
}

// ---- the pipelined kernel: cp.async copies into a ring of ST shared-memory stages of BK columns of K ----
// The same tiles, thread mapping, epilogue and cluster split-K as SimtGemmKernel, but global memory goes straight to
// shared memory (cp.async, 16 bytes a copy, no register staging), ST - 1 stages ahead of the multiply, and a
// stays row-major there ([BM][BK + 4]), read as float4s along k: each float4 serves 4 k steps. For the larger tiles,
// whose fewer blocks must each hide more memory latency (ViT-B's and BERT's GEMMs).
__device__ __forceinline__ void CpAsync16(float* smem, const float* gmem, bool valid) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

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
  int dev = 0;
  cudaGetDevice(&dev);
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (kBytes > 48 * 1024 && (!bit || !(configured.load(std::memory_order_relaxed) & bit))) {
    const cudaError_t err =
        cudaFuncSetAttribute(SimtGemmAsyncKernel<BM, BN, TM, TN, BK, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBytes));
    if (err != cudaSuccess) return err;
    configured.fetch_or(bit, std::memory_order_relaxed);
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM), unsigned(splits));
  cfg.blockDim = dim3(T::kThreads);
  cfg.dynamicSmemBytes = kBytes;
  cfg.stream = stream;
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = 1, cluster[0].val.clusterDim.y = 1, cluster[0].val.clusterDim.z = unsigned(splits);
  cfg.attrs = cluster;
  cfg.numAttrs = splits > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, SimtGemmAsyncKernel<BM, BN, TM, TN, BK, ST>, p);
}

struct SimtVariant {
  int bm, bn, threads;
  bool pipelined;  // the cp.async kernel
  int bk;          // its K columns a stage
  cudaError_t (*launch)(const SimtArgs&, int, cudaStream_t);
};

#define NIMBLE_SIMT_VARIANT(BM, BN, TM, TN) \
  SimtVariant { BM, BN, SimtTile<BM, BN, TM, TN>::kThreads, false, kBK, LaunchSimt<BM, BN, TM, TN> }
#define NIMBLE_SIMT_ASYNC_VARIANT(BM, BN, TM, TN, BK, ST) \
  SimtVariant { BM, BN, AsyncTile<BM, BN, TM, TN, BK, ST>::kThreads, true, BK, LaunchSimtAsync<BM, BN, TM, TN, BK, ST> }
// New variants go at the end: an index baked into an artifact must keep meaning the same kernel.
const SimtVariant kSimtVariants[] = {
    NIMBLE_SIMT_VARIANT(64, 64, 4, 4),        NIMBLE_SIMT_VARIANT(32, 64, 4, 4),
    NIMBLE_SIMT_VARIANT(64, 32, 4, 4),        NIMBLE_SIMT_VARIANT(64, 128, 8, 8),
    NIMBLE_SIMT_VARIANT(32, 128, 4, 8),       NIMBLE_SIMT_VARIANT(128, 64, 8, 4),
    NIMBLE_SIMT_ASYNC_VARIANT(64, 64, 4, 4, 16, 3),  NIMBLE_SIMT_ASYNC_VARIANT(64, 128, 4, 8, 16, 3),
    NIMBLE_SIMT_ASYNC_VARIANT(128, 64, 8, 4, 16, 3), NIMBLE_SIMT_ASYNC_VARIANT(128, 128, 8, 8, 16, 3),
    NIMBLE_SIMT_ASYNC_VARIANT(32, 128, 4, 8, 16, 3),
    // deeper: 32 columns of K a stage, four stages (more bytes in flight per block, for weights that come from
    // HBM rather than L2: ViT-B's GEMMs inside the model ran slower than back to back)
    NIMBLE_SIMT_ASYNC_VARIANT(32, 128, 4, 8, 32, 4), NIMBLE_SIMT_ASYNC_VARIANT(64, 128, 4, 8, 32, 4),
    NIMBLE_SIMT_ASYNC_VARIANT(32, 64, 4, 4, 32, 4),
};
#undef NIMBLE_SIMT_VARIANT
#undef NIMBLE_SIMT_ASYNC_VARIANT
const int kSimtSplits[] = {1, 2, 3, 4, 6, 8};

struct SimtCandidate {
  int variant, splits, k_chunk;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The static rule: the least work on the busiest SM (blocks per SM x a block's multiply-adds), a split
// counting 32 more K columns for its reduction; ties to fewer splits.
double SimtCost(const SimtCandidate& c, int64_t M, int64_t N, int64_t sms) {
  const SimtVariant& v = kSimtVariants[c.variant];
  const int64_t blocks = CeilDiv(M, v.bm) * CeilDiv(N, v.bn) * c.splits;
  return double(CeilDiv(blocks, sms)) * v.bm * v.bn * (c.k_chunk + (c.splits > 1 ? 32 : 0)) + c.splits;
}

// Every (variant, splits) worth timing for this shape, in a fixed order that depends on the shape alone (an index
// baked into an artifact means the same kernel on every GPU of its arch). A split needs thread-block clusters
// (sm_90 and later), at least one kBK stage of its own, and no more than 1,024 blocks in all.
std::vector<SimtCandidate> SimtCandidates(int64_t M, int64_t N, int64_t K, bool clusters) {
  std::vector<SimtCandidate> out;
  for (int v = 0; v < int(sizeof(kSimtVariants) / sizeof(kSimtVariants[0])); ++v) {
    const int64_t tiles = CeilDiv(M, kSimtVariants[v].bm) * CeilDiv(N, kSimtVariants[v].bn);
    for (int s : kSimtSplits) {
      const int64_t chunk = CeilDiv(CeilDiv(K, kBK), s) * kBK;
      if (s > 1 && (!clusters || (s - 1) * chunk >= K || tiles * s > 1024)) continue;
      out.push_back({v, s, int(chunk)});
    }
  }
  return out;
}

// The static rule's pick among `cands` (what a call without an index runs when it cannot measure)
bool HasClusters() {  // the current device's: compute capability 9.0 or later, asked once per device
  static int majors[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return false;
  if (majors[dev] == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    majors[dev] = major > 0 ? major : -1;
  }
  return majors[dev] >= 9;
}

int SimtStaticPick(const std::vector<SimtCandidate>& cands, int64_t M, int64_t N, int64_t sms) {
  int best = 0;
  for (int i = 1; i < int(cands.size()); ++i) {
    if (SimtCost(cands[i], M, N, sms) < SimtCost(cands[best], M, N, sms)) best = i;
  }
  return best;
}

struct SimtCall {
  const char* op = kSimtMatmul;
  int dev = 0;
  SimtArgs p{};
  int64_t index = -1;  // the candidate (-1: the fastest, measured on the first call)
  std::string attrs_str;
};

SimtCall CheckSimt(const char* op, TensorView a, TensorView b, TensorView bias, const TensorView* z, const Shape& attrs,
                   TensorView y, TensorView workspace) {
  SimtCall g;
  g.op = op;
  if (attrs.size() != 1 && attrs.size() != 2) {
    FailValue(op, "attrs must be [activation(, candidate index)], got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  g.p.act = int(attrs[0]);
  g.index = attrs.size() == 2 ? attrs[1] : -1;
  if (g.p.act < 0 || g.p.act > 3) {
    FailValue(op, "activation must be 0 (none), 1 (relu), 2 (relu6) or 3 (gelu), got " + std::to_string(attrs[0]));
  }
  if (g.index < -1) FailValue(op, "the candidate index must be >= 0, got " + std::to_string(g.index));
  if (a.device().device_type != kDLCUDA) {
    FailValue(op, "a must be a CUDA tensor, got device type " + std::to_string(a.device().device_type));
  }
  g.dev = a.device().device_id;
  const std::pair<const char*, const TensorView*> tensors[] = {{"a", &a}, {"b", &b}, {"bias", &bias}, {"y", &y}};
  for (auto& [name, t] : tensors) {
    CheckCudaTensor(op, name, *t, g.dev);
    if (TensorDType(*t) != kF32) {
      FailValue(op, std::string(name) + " has dtype " + DLTypeStr(t->dtype()) + ": this kernel is float32 only");
    }
  }
  CheckWorkspace(op, workspace, g.dev);
  if (a.ndim() < 2) FailValue(op, "a must be [..., M, K], got " + ShapeStr(a));
  CheckNdim(op, "b", b, 2);
  CheckNdim(op, "bias", bias, 1);
  const int64_t K = a.shape()[a.ndim() - 1], M = a.numel() / std::max<int64_t>(K, 1), N = b.shape()[1];
  if (b.shape()[0] != K) FailValue(op, "a " + ShapeStr(a) + " and b " + ShapeStr(b) + " ([K, N]) disagree on K");
  if (bias.shape()[0] != N) FailValue(op, "bias has shape " + ShapeStr(bias) + " but N = " + std::to_string(N));
  bool y_ok = y.ndim() == a.ndim() && y.shape()[y.ndim() - 1] == N;
  for (int i = 0; y_ok && i + 1 < a.ndim(); ++i) y_ok = y.shape()[i] == a.shape()[i];
  if (!y_ok) FailValue(op, "y has shape " + ShapeStr(y) + " but a " + ShapeStr(a) + " and b " + ShapeStr(b) + " give [..., " +
                               std::to_string(N) + "]");
  if (K % 4 || N % 4) FailValue(op, "K and N must be multiples of 4 (float4 rows), got K = " + std::to_string(K) +
                                        ", N = " + std::to_string(N));
  if (M > int64_t(65535) * 32 || K >= (int64_t(1) << 30) || N >= (int64_t(1) << 30)) {
    FailValue(op, "M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K) + " is too large");
  }
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(b)) FailValue(op, "y must not alias a or b");
  g.p.a = static_cast<const float*>(DataPtr(a)), g.p.b = static_cast<const float*>(DataPtr(b));
  g.p.bias = static_cast<const float*>(DataPtr(bias)), g.p.y = static_cast<float*>(DataPtr(y));
  if (z) {
    CheckCudaTensor(op, "z", *z, g.dev);
    if (TensorDType(*z) != kF32) FailValue(op, "z has dtype " + DLTypeStr(z->dtype()) + ": this kernel is float32 only");
    bool same = z->ndim() == y.ndim();
    for (int i = 0; same && i < y.ndim(); ++i) same = z->shape()[i] == y.shape()[i];
    if (!same) FailValue(op, "z has shape " + ShapeStr(*z) + " but y has " + ShapeStr(y) + ": they must be equal");
    g.p.z = static_cast<const float*>(DataPtr(*z));
  }
  for (const void* ptr : {static_cast<const void*>(g.p.a), static_cast<const void*>(g.p.b),
                          static_cast<const void*>(g.p.bias), static_cast<const void*>(g.p.y),
                          static_cast<const void*>(g.p.z)}) {
    if (ptr && PtrAlign(ptr) < 16) FailValue(op, "every tensor must start 16-byte aligned (float4 loads)");
  }
  g.p.M = int(M), g.p.N = int(N), g.p.K = int(K);
  g.attrs_str = ShapeStr(attrs.data(), int(attrs.size()));
  return g;
}

void EnqueueSimt(const SimtCall& g, const SimtCandidate& c, cudaStream_t stream) {
  SimtArgs p = g.p;
  p.k_chunk = c.k_chunk;
  CheckCuda(kSimtVariants[c.variant].launch(p, c.splits, stream), g.op, "cudaLaunchKernelEx");
}

// a candidate this GPU refuses to launch (a cluster shape it cannot schedule) times as this many microseconds
constexpr double kRefusedUs = 1e9;

// Microseconds per call of each candidate, each over `reps` back-to-back calls queued behind a spin kernel.
// Synchronizes: never inside a graph capture.
std::vector<double> TimeSimt(const SimtCall& g, const std::vector<SimtCandidate>& cands, int64_t reps,
                             cudaStream_t stream) {
  std::vector<double> out;
  for (size_t i = 0; i < cands.size(); ++i) {
    SimtArgs p = g.p;
    p.k_chunk = cands[i].k_chunk;
    const cudaError_t err = kSimtVariants[cands[i].variant].launch(p, cands[i].splits, stream);
    if (err != cudaSuccess) {  // a launch-configuration error, not sticky: this candidate is out
      cudaGetLastError();
      out.push_back(kRefusedUs);
      continue;
    }
    const double us = GpuUsPerCall(stream, reps, [&] {
      return kSimtVariants[cands[i].variant].launch(p, cands[i].splits, stream) == cudaSuccess;
    });
    if (us < 0) FailValue(g.op, "timing candidate " + std::to_string(i) + " failed (a launch or CUDA events)");
    out.push_back(us);
  }
  if (!out.empty() && *std::min_element(out.begin(), out.end()) >= kRefusedUs) {
    FailValue(g.op, "this GPU launches none of the candidates for M = " + std::to_string(g.p.M) + ", N = " +
                        std::to_string(g.p.N) + ", K = " + std::to_string(g.p.K));
  }
  return out;
}

bool Capturing(cudaStream_t stream, const char* op) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CheckCuda(cudaStreamIsCapturing(stream, &capturing), op, "cudaStreamIsCapturing");
  return capturing != cudaStreamCaptureStatusNone;
}

// the candidate a call without an index runs, per (device, M, N, K, activation, residual): measured once
std::mutex& ChosenMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::array<int64_t, 6>, int>& Chosen() {
  static std::map<std::array<int64_t, 6>, int> chosen;
  return chosen;
}

void RunSimt(const SimtCall& g) {
  if (g.p.M == 0 || g.p.N == 0) return;
  DeviceGuard guard(g.dev, g.op);
  cudaStream_t stream = CurrentStream(g.dev);
  const std::vector<SimtCandidate> cands = SimtCandidates(g.p.M, g.p.N, g.p.K, HasClusters());
  if (g.index >= int64_t(cands.size())) {
    FailValue(g.op, "candidate " + std::to_string(g.index) + " does not exist: M = " + std::to_string(g.p.M) +
                        ", N = " + std::to_string(g.p.N) + ", K = " + std::to_string(g.p.K) + " has " +
                        std::to_string(cands.size()) + " (an artifact of another tvm-nimble version: rebuild the model)");
  }
  int index = int(g.index);
  if (index < 0) {
    const std::array<int64_t, 6> key{g.dev, g.p.M, g.p.N, g.p.K, g.p.act, g.p.z ? 1 : 0};
    std::lock_guard<std::mutex> lock(ChosenMutex());
    auto it = Chosen().find(key);
    if (it != Chosen().end()) {
      index = it->second;
    } else if (Capturing(stream, g.op) || g.p.z == g.p.y) {
      // under a capture nothing can be timed; and a residual z that is y itself would be added again by every
      // candidate timed
      index = SimtStaticPick(cands, g.p.M, g.p.N, SmCount());
    } else {
      const std::vector<double> us = TimeSimt(g, cands, 10, stream);
      index = int(std::min_element(us.begin(), us.end()) - us.begin());
      Chosen()[key] = index;
    }
  }
  EnqueueSimt(g, cands[index], stream);
}

void SimtMatmul(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  RunSimt(CheckSimt(kSimtMatmul, a, b, bias, nullptr, attrs, y, workspace));
}

void SimtMatmulAdd(TensorView a, TensorView b, TensorView bias, TensorView z, Shape attrs, TensorView y,
                   TensorView workspace) {
  RunSimt(CheckSimt(kSimtMatmulAdd, a, b, bias, &z, attrs, y, workspace));
}

Array<double> SimtTimings(const SimtCall& g, int64_t reps) {
  Array<double> out;
  if (g.p.M == 0 || g.p.N == 0) return out;
  if (reps < 1) FailValue(g.op, "reps must be >= 1, got " + std::to_string(reps));
  DeviceGuard guard(g.dev, g.op);
  cudaStream_t stream = CurrentStream(g.dev);
  if (Capturing(stream, g.op)) FailValue(g.op, "timings cannot be taken inside a CUDA graph capture");
  for (double us : TimeSimt(g, SimtCandidates(g.p.M, g.p.N, g.p.K, HasClusters()), reps, stream)) out.push_back(us);
  return out;
}

Array<double> SimtMatmulTimings(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y,
                                TensorView workspace, int64_t reps) {
  return SimtTimings(CheckSimt(kSimtMatmul, a, b, bias, nullptr, attrs, y, workspace), reps);
}

Array<double> SimtMatmulAddTimings(TensorView a, TensorView b, TensorView bias, TensorView z, Shape attrs, TensorView y,
                                   TensorView workspace, int64_t reps) {
  return SimtTimings(CheckSimt(kSimtMatmulAdd, a, b, bias, &z, attrs, y, workspace), reps);
}

// "BMxBN/S" (tile rows x columns / K splits; "BMxBNpBK/S": the pipelined kernel, BK columns of K a stage) of each
// candidate of an (M, N, K), by index, on a GPU with thread-block
// clusters or without (for explain and the experiments)
Array<String> SimtCandidateNames(int64_t M, int64_t N, int64_t K, bool clusters) {
  Array<String> out;
  if (M < 1 || N < 1 || K < 1) FailValue("nimble.gemm.candidates", "M, N and K must be >= 1");
  for (const SimtCandidate& c : SimtCandidates(M, N, K, clusters)) {
    const SimtVariant& v = kSimtVariants[c.variant];
    out.push_back(String(std::to_string(v.bm) + "x" + std::to_string(v.bn) + (v.pipelined ? "p" + std::to_string(v.bk) : "") +
                         "/" + std::to_string(c.splits)));
  }
  return out;
}

__attribute__((constructor)) void RegisterSimt() {
  try {
    Register(kSimtMatmul, SimtMatmul);
    Register(kSimtMatmulAdd, SimtMatmulAdd);
    Register("nimble.gemm.matmul_timings", SimtMatmulTimings);
    Register("nimble.gemm.matmul_add_timings", SimtMatmulAddTimings);
    Register("nimble.gemm.candidates", SimtCandidateNames);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
