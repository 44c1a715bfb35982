// The split-key attention kernel (nimble.attention.split_sdpa / split_sdpa_bias, described at the top of
// attention.cu) and its launch, shared by the units that instantiate it for one dtype each (attention_split_f32.cu,
// attention_split_f16.cu, attention_split_bf16.cu: they compile side by side, where one unit of every dtype was the
// extension's slowest device unit).
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>

#include "attention_kernels.h"
#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

// ---- the split-key kernel (D, Dv <= 64) ----
constexpr const char* kSplitKernel = "nimble.attention (split-key kernel)";
constexpr int kSplitWarps = 8;
constexpr int kSplitValueRows = 8;  // value rows of a tile loaded at once in P·V


// C: the blocks of a thread-block cluster that share a block of rows, each taking every C-th group of key tiles
// (1: no cluster); blockIdx.x = row block * C + the block's rank in its cluster.
template <typename T, typename M, int DC, int R>  // DC: columns per lane (1 or 2); R: query rows per block
__global__ void __launch_bounds__(kSplitWarps * 32) SdpaSplitKernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                   const T* __restrict__ v, const M* __restrict__ m,
                                                                   T* __restrict__ o, SdpaParams p, bool vec_k, int C) {
  constexpr int W = 32 * DC;  // padded head width
  static_assert(R % 4 == 0, "the probabilities are read four rows at a time");
  __shared__ __align__(16) float Qs[R][W];
  // per warp: first its tile's probabilities P[j][r] (read as float4 broadcasts over r; rows PS apart,
  // not R: lane j writes row j, and a stride of R would put the 32 lanes on two banks), then its
  // partial output A[r][d] (a warp writes A only after its last use of P)
  constexpr int PS = R + 4, SCRATCH = 32 * PS > R * W ? 32 * PS : R * W;
  __shared__ __align__(16) float Scratch[kSplitWarps][SCRATCH];
  __shared__ float Ms[kSplitWarps][R], Ls[kSplitWarps][R];
  const int rank = int(blockIdx.x) % C;
  const int64_t b = blockIdx.z, h = blockIdx.y, row0 = int64_t(blockIdx.x / C) * R;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int D = int(p.D), Dv = int(p.Dv);
  const T* qb = q + p.q_off + b * p.q_sb + h * p.q_sh;
  const T* kb = k + p.k_off + b * p.k_sb + (h / p.group) * p.k_sh;
  const T* vb = v + p.v_off + b * p.v_sb + (h / p.group) * p.v_sh;
  const M* mb = m ? m + b * p.m_sb + h * p.m_sh : nullptr;
  for (int i = threadIdx.x; i < R * W; i += blockDim.x) {  // the block's rows, scaled; zeros pad rows and width
    const int r = i / W, d = i % W;
    const int64_t s = row0 + r;
    Qs[r][d] = s < p.Sq && d < D ? ToF(qb[s * p.q_ss + d]) * p.scale : 0.0f;
  }
  __syncthreads();
  float mx[R], lsum[R], acc[R][DC];  // lsum: this lane's share of the row sums
#pragma unroll
  for (int r = 0; r < R; ++r) {
    mx[r] = -INFINITY;
    lsum[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[r][c] = 0.0f;
  }
  float* P = Scratch[warp];
  const int64_t tiles = (p.Sk + 31) / 32;
  for (int64_t t = int64_t(rank) * warps + warp; t < tiles; t += int64_t(warps) * C) {
    const int64_t key = t * 32 + lane;
    const bool valid = key < p.Sk;
    const T* kr = kb + (valid ? key : 0) * p.k_ss;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
#pragma unroll
    for (int d = 0; d < W; d += 4) {
      const float4 kv = valid ? Load4(kr, d, D, vec_k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 qv = *reinterpret_cast<const float4*>(&Qs[r][d]);
        s[r] = fmaf(qv.x, kv.x, fmaf(qv.y, kv.y, fmaf(qv.z, kv.z, fmaf(qv.w, kv.w, s[r]))));
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!valid) s[r] = -INFINITY;
      else if (m) s[r] += ToF(mb[min(row0 + r, p.Sq - 1) * p.m_sq + key * p.m_sk]);
      float tmax = s[r];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float mnew = fmaxf(mx[r], tmax);
      const bool none = mnew == -INFINITY;  // every score so far is -inf: nothing to weigh yet
      const float e = none ? 0.0f : expf(s[r] - mnew);
      const float corr = none ? 1.0f : expf(mx[r] - mnew);
      mx[r] = mnew;
      lsum[r] = lsum[r] * corr + e;
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[r][c] *= corr;
      P[lane * PS + r] = e;
    }
    __syncwarp();
    // P·V over the tile's keys, eight value rows loaded before they are used: a row at a time, each load's
    // latency (an L2 round trip) was paid 32 times in a row. Keys past Sk have P = 0 and load zeros.
    const int keys = p.Sk - t * 32 < 32 ? int(p.Sk - t * 32) : 32;
#pragma unroll 1
    for (int j0 = 0; j0 < 32; j0 += kSplitValueRows) {
      float vv[kSplitValueRows][DC];
#pragma unroll
      for (int jj = 0; jj < kSplitValueRows; ++jj) {
        const T* vr = vb + (t * 32 + j0 + jj) * p.v_ss;
#pragma unroll
        for (int c = 0; c < DC; ++c) vv[jj][c] = j0 + jj < keys && lane + 32 * c < Dv ? ToF(vr[lane + 32 * c]) : 0.0f;
      }
#pragma unroll
      for (int jj = 0; jj < kSplitValueRows; ++jj) {
#pragma unroll
        for (int r = 0; r < R; r += 4) {
          const float4 pj = *reinterpret_cast<const float4*>(&P[(j0 + jj) * PS + r]);
#pragma unroll
          for (int c = 0; c < DC; ++c) {
            acc[r][c] = fmaf(pj.x, vv[jj][c], acc[r][c]);
            acc[r + 1][c] = fmaf(pj.y, vv[jj][c], acc[r + 1][c]);
            acc[r + 2][c] = fmaf(pj.z, vv[jj][c], acc[r + 2][c]);
            acc[r + 3][c] = fmaf(pj.w, vv[jj][c], acc[r + 3][c]);
          }
        }
      }
    }
    __syncwarp();  // P is rewritten by the next tile (or becomes A)
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) lsum[r] += __shfl_xor_sync(0xffffffffu, lsum[r], off);
    if (lane == 0) {
      Ms[warp][r] = mx[r];
      Ls[warp][r] = lsum[r];
    }
#pragma unroll
    for (int c = 0; c < DC; ++c) P[r * W + lane + 32 * c] = acc[r][c];
  }
  // combine the partials of every warp of every block of the cluster (a block's own shared memory when C = 1),
  // each block a share of the outputs, in a fixed order (deterministic)
  ClusterSync(C);
  for (int i = rank * blockDim.x + threadIdx.x; i < R * Dv; i += C * blockDim.x) {
    const int r = i / Dv, d = i % Dv;
    const int64_t s = row0 + r;
    if (s >= p.Sq) continue;
    float mmax = -INFINITY;
    for (int c = 0; c < C; ++c) {
      const float* ms = OfBlock(&Ms[0][0], c, C);
      for (int w = 0; w < warps; ++w) mmax = fmaxf(mmax, ms[w * R + r]);
    }
    float L = 0.0f, O = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float *ms = OfBlock(&Ms[0][0], c, C), *ls = OfBlock(&Ls[0][0], c, C);
      const float* sc = OfBlock(&Scratch[0][0], c, C);
      for (int w = 0; w < warps; ++w) {
        const float wt = ms[w * R + r] == -INFINITY ? 0.0f : expf(ms[w * R + r] - mmax);
        L += wt * ls[w * R + r];
        O += wt * sc[w * SCRATCH + r * W + d];
      }
    }
    o[b * p.o_sb + h * p.o_sh + s * p.o_ss + d] = FromF<T>(Normalised(O, L));
  }
  if (C > 1) ClusterSync(C);  // no block leaves while another still reads its shared memory
}

template <typename T, typename M, int DC, int R>
struct SplitLaunch {  // one instantiation of the split-key kernel: its grid and how many of its blocks an SM holds
  static int Warps(const SdpaParams& p, int C = 1) {  // no more warps than a block has key tiles
    return int(std::max<int64_t>(1, std::min<int64_t>(kSplitWarps, ((p.Sk + 31) / 32 + C - 1) / C)));
  }
  static int64_t Blocks(const SdpaParams& p) { return (p.Sq + R - 1) / R * p.H * p.B; }
  static int PerSm(const SdpaParams& p) {  // asked once per block size (an occupancy query costs microseconds)
    static std::atomic<int> known[kSplitWarps + 1] = {};
    const int warps = Warps(p);
    int n = known[warps].load(std::memory_order_relaxed);
    if (n == 0) {
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, SdpaSplitKernel<T, M, DC, R>, warps * 32, 0);
      n = n > 0 ? n : 1;
      known[warps].store(n, std::memory_order_relaxed);
    }
    return n;
  }
  // C: the blocks of a cluster that split a row block's keys (1: none)
  static void Launch(const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y, cudaStream_t stream,
                     int C = 1) {
    const size_t align = sizeof(T) == 4 ? 16 : 8;  // a row's 4-element vector loads
    const bool vec_k = reinterpret_cast<uintptr_t>(k + p.k_off) % align == 0 && p.k_sb % 4 == 0 && p.k_sh % 4 == 0 &&
                       p.k_ss % 4 == 0;
    const dim3 grid(unsigned((p.Sq + R - 1) / R * C), unsigned(p.H), unsigned(p.B));
    CheckCuda(KernelLaunch(grid, dim3(unsigned(Warps(p, C) * 32)), stream)
                  .Cluster(unsigned(C))(SdpaSplitKernel<T, M, DC, R>, q, k, v, m, y, p, vec_k, C),
              kSplitKernel, "cudaLaunchKernelEx");
  }
};

// The blocks of a cluster that split the keys of a call whose rows fit one block of R (a decode step): the most of
// 8, 4, 2 whose grid still fits the SMs once, each block keeping a key tile; 1 (no cluster) for more rows, and on
// GPUs without thread-block clusters.
int DecodeSplits(const SdpaParams& p, int R, int64_t sms) {
  if (p.Sq > R || DeviceAttribute<cudaDevAttrClusterLaunch>(0) <= 0) return 1;
  const int64_t blocks = p.H * p.B, tiles = (p.Sk + 31) / 32;
  for (int c : {8, 4, 2}) {
    if (blocks * c <= sms && tiles >= c) return c;
  }
  return 1;
}

// R: the fewest waves of blocks over the SMs first (a second, partial wave costs a whole block's time),
// then a grid that has a block for every SM, then no block mostly padding (a decode step's one query row in a
// block of 16 computed 16 score and output rows per key: where R >= 2 Sq, the fewest rows), then the most rows
// per block (K and V read fewer times).
template <typename T, typename M, int DC>
void LaunchSplitRows(const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y, cudaStream_t stream) {
  const int64_t sms = SmCount();
  auto score = [&](int64_t blocks, int per_sm, int rows) {
    const int64_t waves = (blocks + sms * per_sm - 1) / (sms * per_sm);
    const int mostly_padding = rows >= 2 * p.Sq ? rows : 0;
    return std::make_tuple(waves, blocks < sms ? 1 : 0, mostly_padding, -rows);
  };
  const auto s16 = score(SplitLaunch<T, M, DC, 16>::Blocks(p), SplitLaunch<T, M, DC, 16>::PerSm(p), 16);
  const auto s8 = score(SplitLaunch<T, M, DC, 8>::Blocks(p), SplitLaunch<T, M, DC, 8>::PerSm(p), 8);
  const auto s4 = score(SplitLaunch<T, M, DC, 4>::Blocks(p), SplitLaunch<T, M, DC, 4>::PerSm(p), 4);
  if (s16 <= s8 && s16 <= s4) SplitLaunch<T, M, DC, 16>::Launch(p, q, k, v, m, y, stream);
  else if (s8 <= s4) SplitLaunch<T, M, DC, 8>::Launch(p, q, k, v, m, y, stream);
  else SplitLaunch<T, M, DC, 4>::Launch(p, q, k, v, m, y, stream, DecodeSplits(p, 4, sms));
}

// The split-key kernel on q, k, v of T and the mask of M, for heads up to 64 (D, Dv).
template <typename T, typename M>
void LaunchSplitTyped(const SdpaParams& p, const void* q, const void* k, const void* v, const void* m, void* y,
                      cudaStream_t stream) {
  const auto* qt = static_cast<const T*>(q);
  const auto* kt = static_cast<const T*>(k);
  const auto* vt = static_cast<const T*>(v);
  const auto* mt = static_cast<const M*>(m);
  auto* yt = static_cast<T*>(y);
  if (std::max(p.D, p.Dv) <= 32) LaunchSplitRows<T, M, 1>(p, qt, kt, vt, mt, yt, stream);
  else LaunchSplitRows<T, M, 2>(p, qt, kt, vt, mt, yt, stream);
}

}  // namespace
}  // namespace nimble_vendor
