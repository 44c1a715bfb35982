// The key-split fused attention kernel for fp32: nimble.attention.cluster_sdpa / cluster_sdpa_bias (the attrs of
// attention.cu's calls, which register them and launch this one through LaunchClusterAttention).
//
// The other kernels give a block all of a head's keys, so at batch 1 a ViT-B attention is 84 blocks (12 heads x 7
// tiles of 32 query rows), each doing its ~0.8 M FMAs alone on an SM while 48 SMs idle. Here the keys are split
// too: a block takes 32 query rows and one chunk of at most 64 keys, and the C chunks of a query tile (C = 1, 2, 4
// or 8) are the C blocks of a thread-block cluster (Hopper). Each block computes its chunk's scores, their local
// softmax (row max m, row sum l, P = exp(S - m) unnormalised) and P·V from shared memory, parks m, l and its
// partial output in shared memory, and after a cluster barrier each block merges a slice of the rows across the
// cluster's shared memories (distributed shared memory; a fixed order, so the result is deterministic):
//   O = sum_c exp(m_c - M) O_c / sum_c exp(m_c - M) l_c,  M = max_c m_c.
// ViT-B: C = 4, 336 blocks of 32 rows x 50 keys; ViT-S: C = 4; BERT-base (128 keys): C = 4.
//
// Staging is cp.async (16 bytes a copy, zero-filled past the valid rows: no register round trip), so the kernel
// takes fp32 rows that are 16-byte aligned, D and Dv multiples of 4 up to 64, and at most 8 x 64 = 512 keys; other
// calls (and GPUs without clusters, where only 64 keys fit one block) run the tile kernel inside the same call.
// Thread mapping (128 threads, 8 groups of 4 rows x 16 lanes): in Q·Kᵀ a thread computes 4 rows x 4 keys
// (keys kg, kg + 16, kg + 32, kg + 48: 8 neighbouring lanes read 8 neighbouring K rows, on distinct banks by the
// odd-quad pitch; Q rows are broadcasts), the row max and sum are 4-step shuffles over the 16 lanes of a row group;
// in P·V a thread computes 4 rows x 4 columns (V rows read as 256 contiguous bytes, P rows as broadcasts).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "attention_kernels.h"
#include "common.h"
#include "sdpa_args.h"

namespace cg = cooperative_groups;

namespace nimble_vendor {
namespace {

constexpr int kClThreads = 128, kClRows = 32, kClMaxKeys = 64, kClMaxD = 64, kClMaxSplits = 8;
constexpr int kClPitch = 68;  // Q, K and S rows (floats): 17 float4s, odd, so 8 neighbouring rows hit distinct banks

struct ClusterLayout {  // shared memory in floats: Q [32][68], K [64][68] (then the partial O), V [64][64], S [32][68]
  static constexpr int q_at = 0, k_at = q_at + kClRows * kClPitch, v_at = k_at + kClMaxKeys * kClPitch,
                       s_at = v_at + kClMaxKeys * kClMaxD, m_at = s_at + kClRows * kClPitch, l_at = m_at + kClRows,
                       total = l_at + kClRows;
};
constexpr size_t kClSmemBytes = size_t(ClusterLayout::total) * sizeof(float);

// rows x quads float4s of src (rows `stride` floats apart) into dst (rows `pitch` floats apart); rows from `valid`
// on are zero-filled (nothing read)
__device__ __forceinline__ void ClStage(float* dst, int pitch, const float* src, int64_t stride, int rows, int valid,
                                        int quads, int tid) {
  for (int c = tid; c < rows * quads; c += kClThreads) {
    const int r = c / quads, x = c % quads;
    const bool ok = r < valid;
    CpAsync16(dst + r * pitch + 4 * x, ok ? src + r * stride + 4 * x : src, ok);
  }
}

// grid: (query tiles x C, H, B), clusters of C blocks along x (C = 1: no cluster). kc: keys per chunk (<= 64).
template <bool kMasked>
__global__ void __launch_bounds__(kClThreads, 4) SdpaClusterKernel(const float* __restrict__ q,
                                                                  const float* __restrict__ k,
                                                                  const float* __restrict__ v,
                                                                  const float* __restrict__ m, float* __restrict__ o,
                                                                  SdpaParams p, int splits, int kc) {
  extern __shared__ __align__(16) float cl_smem[];
  using L = ClusterLayout;
  float* Qs = cl_smem + L::q_at;
  float* Ks = cl_smem + L::k_at;
  float* Vs = cl_smem + L::v_at;
  float* Ss = cl_smem + L::s_at;
  float* Ms = cl_smem + L::m_at;
  float* Ls = cl_smem + L::l_at;
  const int tid = threadIdx.x;
  const int rank = int(blockIdx.x) % splits;
  const int64_t b = blockIdx.z, h = blockIdx.y, row0 = int64_t(blockIdx.x / splits) * kClRows;
  const int rows = int(p.Sq - row0 < kClRows ? p.Sq - row0 : kClRows);  // valid query rows (>= 1)
  const int64_t key0 = int64_t(rank) * kc;
  const int64_t left = p.Sk - key0;
  const int keys = left <= 0 ? 0 : left < kc ? int(left) : kc;  // valid keys of the chunk (0: a chunk past Sk)
  const int ks16 = (kc + 15) / 16 * 16;  // keys staged (zeros past `keys`) and computed on, <= 64
  const int dq = int(p.D) / 4, vq = int(p.Dv) / 4;

  // 1. Q and K (one group), then V (a second group, waited for after the softmax)
  const float* qb = q + p.q_off + b * p.q_sb + h * p.q_sh + row0 * p.q_ss;
  const float* kb = k + p.k_off + b * p.k_sb + (h / p.group) * p.k_sh + key0 * p.k_ss;
  const float* vb = v + p.v_off + b * p.v_sb + (h / p.group) * p.v_sh + key0 * p.v_ss;
  ClStage(Qs, kClPitch, qb, p.q_ss, kClRows, rows, dq, tid);
  ClStage(Ks, kClPitch, kb, p.k_ss, ks16, keys, dq, tid);
  CpAsyncCommit();
  ClStage(Vs, kClMaxD, vb, p.v_ss, ks16, keys, vq, tid);
  CpAsyncCommit();
  CpAsyncWait<1>();
  __syncthreads();

  // 2. S = scale * Q·Kᵀ (+ mask): rows 4 rg .. 4 rg + 3, keys kg + 16 i
  const int rg = tid / 16, kg = tid % 16, ni = ks16 / 16;
  float acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.0f;
  const float* qr = Qs + 4 * rg * kClPitch;
  const float* kr = Ks + kg * kClPitch;
  for (int d = 0; d < 4 * dq; d += 4) {
    float4 qv[4], kv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) qv[r] = *reinterpret_cast<const float4*>(qr + r * kClPitch + d);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i < ni) kv[i] = *reinterpret_cast<const float4*>(kr + 16 * i * kClPitch + d);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i < ni) {
          acc[r][i] = fmaf(qv[r].w, kv[i].w,
                           fmaf(qv[r].z, kv[i].z, fmaf(qv[r].y, kv[i].y, fmaf(qv[r].x, kv[i].x, acc[r][i]))));
        }
      }
    }
  }

  // 3. the chunk's softmax per row: max and sum over the 16 lanes of the row group; P unnormalised into S
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int row = 4 * rg + r;
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int j = kg + 16 * i;
      float s = -INFINITY;
      if (j < keys) {
        s = acc[r][i] * p.scale;
        if (kMasked && row < rows) s += m[b * p.m_sb + h * p.m_sh + (row0 + row) * p.m_sq + (key0 + j) * p.m_sk];
      }
      acc[r][i] = s;
      mx = fmaxf(mx, s);
    }
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float e = acc[r][i] == -INFINITY ? 0.0f : expf(acc[r][i] - mx);  // a masked-out chunk row: all zeros
      sum += e;
      if (i < ni) Ss[row * kClPitch + kg + 16 * i] = e;
    }
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (kg == 0) Ms[row] = mx, Ls[row] = sum;
  }
  CpAsyncWait<0>();
  __syncthreads();  // S (P), m, l and V complete; K consumed

  // 4. O = P·V: rows 4 rg .. 4 rg + 3, columns 4 dc .. 4 dc + 3
  const int dc = kg;
  float out[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r) out[r][0] = out[r][1] = out[r][2] = out[r][3] = 0.0f;
  if (dc < vq) {
    const float* pr = Ss + 4 * rg * kClPitch;
    const float* vr = Vs + 4 * dc;
    for (int j = 0; j < ks16; j += 4) {
      float4 vv[4], pv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) vv[i] = *reinterpret_cast<const float4*>(vr + (j + i) * kClMaxD);
#pragma unroll
      for (int r = 0; r < 4; ++r) pv[r] = *reinterpret_cast<const float4*>(pr + r * kClPitch + j);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        out[r][0] = fmaf(pv[r].w, vv[3].x, fmaf(pv[r].z, vv[2].x, fmaf(pv[r].y, vv[1].x, fmaf(pv[r].x, vv[0].x, out[r][0]))));
        out[r][1] = fmaf(pv[r].w, vv[3].y, fmaf(pv[r].z, vv[2].y, fmaf(pv[r].y, vv[1].y, fmaf(pv[r].x, vv[0].y, out[r][1]))));
        out[r][2] = fmaf(pv[r].w, vv[3].z, fmaf(pv[r].z, vv[2].z, fmaf(pv[r].y, vv[1].z, fmaf(pv[r].x, vv[0].z, out[r][2]))));
        out[r][3] = fmaf(pv[r].w, vv[3].w, fmaf(pv[r].z, vv[2].w, fmaf(pv[r].y, vv[1].w, fmaf(pv[r].x, vv[0].w, out[r][3]))));
      }
    }
  }
  float* ob = o + b * p.o_sb + h * p.o_sh + row0 * p.o_ss;
  if (splits == 1) {  // the whole head's keys: normalise and write (a row whose scores are all -inf: 0, see Normalised)
    if (dc < vq) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = 4 * rg + r;
        if (row < rows) {
          const float l = Ls[row];
          *reinterpret_cast<float4*>(ob + row * p.o_ss + 4 * dc) =
              make_float4(Normalised(out[r][0], l), Normalised(out[r][1], l), Normalised(out[r][2], l),
                          Normalised(out[r][3], l));
        }
      }
    }
    return;
  }

  // 5. merge across the cluster: the partial O over K's memory, then each block takes 32 / C of the rows
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float* Os = Ks;  // [32][68]
  if (dc < vq) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      *reinterpret_cast<float4*>(Os + (4 * rg + r) * kClPitch + 4 * dc) =
          make_float4(out[r][0], out[r][1], out[r][2], out[r][3]);
    }
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int me = int(cluster.block_rank()), per = kClRows / splits;
  for (int it = tid; it < per * vq; it += kClThreads) {
    const int row = me * per + it / vq, c = it % vq;
    if (row >= rows) continue;
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, cluster.map_shared_rank(Ms, s)[row]);
    float l = 0.0f;
    float4 acc4 = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s = 0; s < splits; ++s) {  // the same order in every block: deterministic
      const float ms = cluster.map_shared_rank(Ms, s)[row];
      const float w = ms == -INFINITY ? 0.0f : expf(ms - mx);
      l += w * cluster.map_shared_rank(Ls, s)[row];
      const float4 x = *reinterpret_cast<const float4*>(cluster.map_shared_rank(Os, s) + row * kClPitch + 4 * c);
      acc4.x += w * x.x, acc4.y += w * x.y, acc4.z += w * x.z, acc4.w += w * x.w;
    }
    *reinterpret_cast<float4*>(ob + row * p.o_ss + 4 * c) = make_float4(Normalised(acc4.x, l), Normalised(acc4.y, l),
                                                                     Normalised(acc4.z, l), Normalised(acc4.w, l));
  }
  cluster.sync();  // no block leaves while another still reads its shared memory
#else
  __trap();  // splits > 1 needs thread-block clusters; the host launches them only on sm_90 and later
#endif
}

// The keys per block and the cluster size C for a call, or 0 when the kernel does not take it: the fewest splits of
// at most 64 keys each, then doubled while the grid has fewer blocks than the GPU has SMs and a chunk keeps 16 keys
// or more. Fitted to H100 timings of every C in every attention_check case: it picks the fastest C for ViT-S, ViT-B,
// BERT, ViT-S at batch 8 and a single query tile of 197 keys, where doubling up to two blocks per SM took C = 8 for
// ViT-S and BERT (see benchmarks/findings.md, 'Transformers in fp32 and fp16 past both peers, a key-split attention
// kernel, nasnetalarge in half precision').
// NIMBLE_ATTENTION_CLUSTER=1|2|4|8 forces C where its chunks fit (for experiments: attention_check times each).
int ClusterSplits(const SdpaParams& p, bool clusters, int64_t sms) {
  const int64_t tiles = (p.Sq + kClRows - 1) / kClRows * p.H * p.B;
  auto chunk = [&](int c) { return (p.Sk + c - 1) / c; };
  const int max_c = clusters ? kClMaxSplits : 1;
  if (const char* env = std::getenv("NIMBLE_ATTENTION_CLUSTER")) {
    const int c = std::atoi(env);
    if ((c == 1 || c == 2 || c == 4 || c == 8) && c <= max_c && chunk(c) <= kClMaxKeys) return c;
  }
  int c = 1;
  while (c <= max_c && chunk(c) > kClMaxKeys) c *= 2;
  if (c > max_c) return 0;
  while (2 * c <= max_c && tiles * c < sms && chunk(2 * c) >= 16) c *= 2;
  return c;
}

}  // namespace

bool LaunchClusterAttention(const char* op, const SdpaParams& p, int dtype, const void* q, const void* k,
                            const void* v, const void* m, void* y, cudaStream_t stream) {
  if (dtype != kF32 || p.D > kClMaxD || p.Dv > kClMaxD || p.D % 4 || p.Dv % 4) return false;
  auto aligned = [](const void* base, int64_t off, int64_t sb, int64_t sh, int64_t ss) {
    return reinterpret_cast<uintptr_t>(static_cast<const float*>(base) + off) % 16 == 0 && sb % 4 == 0 &&
           sh % 4 == 0 && ss % 4 == 0;
  };
  if (!aligned(q, p.q_off, p.q_sb, p.q_sh, p.q_ss) || !aligned(k, p.k_off, p.k_sb, p.k_sh, p.k_ss) ||
      !aligned(v, p.v_off, p.v_sb, p.v_sh, p.v_ss) || !aligned(y, 0, p.o_sb, p.o_sh, p.o_ss)) {
    return false;
  }
  const bool clusters = DeviceAttribute<cudaDevAttrClusterLaunch>(0) > 0;
  const int splits = ClusterSplits(p, clusters, SmCount());
  if (splits == 0) return false;
  static std::atomic<uint64_t> configured{0};
  CheckCuda(OncePerDevice(configured, [] {
              cudaError_t err = cudaFuncSetAttribute(SdpaClusterKernel<false>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(kClSmemBytes));
              if (err == cudaSuccess) {
                err = cudaFuncSetAttribute(SdpaClusterKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(kClSmemBytes));
              }
              return err;
            }),
            op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  const int kc = int((p.Sk + splits - 1) / splits);
  KernelLaunch launch(dim3(unsigned((p.Sq + kClRows - 1) / kClRows * splits), unsigned(p.H), unsigned(p.B)),
                      dim3(kClThreads), stream, kClSmemBytes);
  launch.Cluster(unsigned(splits));
  const auto* qf = static_cast<const float*>(q);
  const auto* kf = static_cast<const float*>(k);
  const auto* vf = static_cast<const float*>(v);
  const auto* mf = static_cast<const float*>(m);
  auto* yf = static_cast<float*>(y);
  const cudaError_t err = m ? launch(SdpaClusterKernel<true>, qf, kf, vf, mf, yf, p, splits, kc)
                            : launch(SdpaClusterKernel<false>, qf, kf, vf, mf, yf, p, splits, kc);
  CheckCuda(err, op, "cudaLaunchKernelEx");
  return true;
}

}  // namespace nimble_vendor
