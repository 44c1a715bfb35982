// The row-per-warp attention kernel (nimble.attention.sdpa / sdpa_bias, and the split-key calls' heads over 64),
// described with the other attention calls at the top of attention.cu; a unit of its own so that it compiles beside
// attention.cu's split-key kernels (each unit is one nvcc process).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_kernels.h"
#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

constexpr int kWarps = 8, kRowsPerWarp = 1, kTileK = 32, kMaxD = 128;
constexpr int kTileRowsPerWarp = kTileK / kWarps;  // key rows of a tile each warp loads
static_assert(kTileK == 32, "one key per lane");

template <typename T, typename M, int DC>  // M: the mask's type (T or float); DC: columns per lane, ceil(max(D, Dv) / 32)
__global__ void __launch_bounds__(kWarps * 32, 2) SdpaKernel(const T* __restrict__ q, const T* __restrict__ k,
                                                          const T* __restrict__ v, const M* __restrict__ m,
                                                          T* __restrict__ o, SdpaParams p) {
  // Every loop below has independent chains (two rows, four partial dot products, DC columns) and a
  // fixed trip count where it matters: one warp per SM-slot must keep its FMA pipes busy on its own,
  // since batch-1 attention has only a few warps per SM. Rows past Sq compute on zeros and are not
  // written; keys past Sk have -inf scores and zero values.
  constexpr int R = kRowsPerWarp;
  __shared__ __align__(16) float Qs[kWarps * R][kMaxD];
  __shared__ __align__(16) float Ks[kTileK][kMaxD + 4];  // float4 rows; +4: quarter-warps hit distinct banks
  __shared__ __align__(16) float Vs[kTileK][kMaxD];
  __shared__ float Ps[kWarps][R][kTileK];  // the tile's probabilities, read back as broadcasts
  const int64_t b = blockIdx.z, h = blockIdx.y, row0 = int64_t(blockIdx.x) * kWarps * R;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int D = int(p.D), Dv = int(p.Dv);
  const T* qb = q + p.q_off + b * p.q_sb + h * p.q_sh;  // this (batch, head)'s views
  const T* kb = k + p.k_off + b * p.k_sb + (h / p.group) * p.k_sh;
  const T* vb = v + p.v_off + b * p.v_sb + (h / p.group) * p.v_sh;
  const M* mb = m ? m + b * p.m_sb + h * p.m_sh : nullptr;
  // Global loads: a warp reads whole rows (lane, lane + 32, ...: coalesced), fixed trip counts so that
  // all of a thread's loads are in flight at once; the next key tile is fetched into registers while
  // the current one is computed on.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t s = row0 + warp * R + r;
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      Qs[warp * R + r][d] = s < p.Sq && d < D ? ToF(qb[s * p.q_ss + d]) * p.scale : 0.0f;  // zeros pad to 32 * DC
    }
  }
  float kn[kTileRowsPerWarp][DC], vn[kTileRowsPerWarp][DC];
  auto fetch = [&](int64_t k0) {
#pragma unroll
    for (int jj = 0; jj < kTileRowsPerWarp; ++jj) {
      const int64_t key = k0 + warp * kTileRowsPerWarp + jj;
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        const int d = lane + 32 * c;
        kn[jj][c] = key < p.Sk && d < D ? ToF(kb[key * p.k_ss + d]) : 0.0f;
        vn[jj][c] = key < p.Sk && d < Dv ? ToF(vb[key * p.v_ss + d]) : 0.0f;
      }
    }
  };
  float mx[R], sum[R], acc[R][DC];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    mx[r] = -INFINITY;
    sum[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[r][c] = 0.0f;
  }
  fetch(0);
  for (int64_t k0 = 0; k0 < p.Sk; k0 += kTileK) {
    __syncthreads();  // the previous tile consumed
#pragma unroll
    for (int jj = 0; jj < kTileRowsPerWarp; ++jj) {
      const int j = warp * kTileRowsPerWarp + jj;
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        const int d = lane + 32 * c;
        if (d < kMaxD) {
          Ks[j][d] = kn[jj][c];
          Vs[j][d] = vn[jj][c];
        }
      }
    }
    __syncthreads();
    if (k0 + kTileK < p.Sk) fetch(k0 + kTileK);
    const int64_t key = k0 + lane;
    float dot[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = dot[r][2] = dot[r][3] = 0.0f;
    // the padded width 32 * DC is a compile-time bound: the loop unrolls (q and k are zero past D)
#pragma unroll
    for (int d = 0; d < 32 * DC; d += 4) {
      const float4 kv = *reinterpret_cast<const float4*>(&Ks[lane][d]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 qv = *reinterpret_cast<const float4*>(&Qs[warp * R + r][d]);
        dot[r][0] += qv.x * kv.x;
        dot[r][1] += qv.y * kv.y;
        dot[r][2] += qv.z * kv.z;
        dot[r][3] += qv.w * kv.w;
      }
    }
    float e[R], corr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float score = -INFINITY;
      if (key < p.Sk) {
        score = (dot[r][0] + dot[r][1]) + (dot[r][2] + dot[r][3]);
        if (m) score += ToF(mb[min(row0 + warp * R + r, p.Sq - 1) * p.m_sq + key * p.m_sk]);
      }
      e[r] = score;
    }
    float tile_max[R];
#pragma unroll
    for (int r = 0; r < R; ++r) tile_max[r] = e[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], o));
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float mnew = fmaxf(mx[r], tile_max[r]);
      const bool none = mnew == -INFINITY;  // every score so far is -inf: nothing to weigh yet
      e[r] = none ? 0.0f : expf(e[r] - mnew);
      corr[r] = none ? 1.0f : expf(mx[r] - mnew);
      mx[r] = mnew;
      Ps[warp][r][lane] = e[r];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) e[r] += __shfl_xor_sync(0xffffffffu, e[r], o);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      sum[r] = sum[r] * corr[r] + e[r];
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[r][c] *= corr[r];
    }
    __syncwarp();
#pragma unroll 8
    for (int j = 0; j < kTileK; ++j) {
      float vv[DC];
#pragma unroll
      for (int c = 0; c < DC; ++c) vv[c] = (lane + 32 * c < Dv) ? Vs[j][lane + 32 * c] : 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float pj = Ps[warp][r][j];
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[r][c] += pj * vv[c];
      }
    }
    __syncwarp();  // Ps is rewritten by the next tile
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t s = row0 + warp * R + r;
    if (s < p.Sq) {
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        const int d = lane + 32 * c;
        if (d < Dv) o[b * p.o_sb + h * p.o_sh + s * p.o_ss + d] = FromF<T>(Normalised(acc[r][c], sum[r]));
      }
    }
  }
}

// ---- the row-per-warp kernel's launch (D or Dv > 64) ----
template <typename T, typename M, int DC>
void LaunchSdpaDC(const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y, cudaStream_t stream) {
  dim3 grid(unsigned((p.Sq + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)), unsigned(p.H), unsigned(p.B));
  SdpaKernel<T, M, DC><<<grid, kWarps * 32, 0, stream>>>(q, k, v, m, y, p);
}

template <typename T, typename M>
void LaunchRows(const SdpaParams& p, const void* q, const void* k, const void* v, const void* m, void* y,
                cudaStream_t stream) {
  const auto* qt = static_cast<const T*>(q);
  const auto* kt = static_cast<const T*>(k);
  const auto* vt = static_cast<const T*>(v);
  const auto* mt = static_cast<const M*>(m);
  auto* yt = static_cast<T*>(y);
  const int dc = int((std::max(p.D, p.Dv) + 31) / 32);  // columns per lane of q, k and v
  if (dc == 1) LaunchSdpaDC<T, M, 1>(p, qt, kt, vt, mt, yt, stream);
  else if (dc == 2) LaunchSdpaDC<T, M, 2>(p, qt, kt, vt, mt, yt, stream);
  else if (dc == 3) LaunchSdpaDC<T, M, 3>(p, qt, kt, vt, mt, yt, stream);
  else LaunchSdpaDC<T, M, 4>(p, qt, kt, vt, mt, yt, stream);
}

}  // namespace

void LaunchRowPerWarpAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k,
                               const void* v, const void* m, void* y, cudaStream_t stream) {
  WithAttentionTypes(dtype, f32_mask, [&](auto t, auto mask) {
    LaunchRows<decltype(t), decltype(mask)>(p, q, k, v, m, y, stream);
  });
}

}  // namespace nimble_vendor
