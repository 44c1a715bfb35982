// Fused scaled-dot-product attention for small-batch inference, one kernel instead of Nimble's
// transposes + Q·Kᵀ + scale + softmax + ·V + transpose (seven launches per attention in a ViT):
//
//   nimble.attention.sdpa(q, k, v, attrs, y, workspace)
//   nimble.attention.sdpa_bias(q, k, v, bias, attrs, y, workspace)
//       y[b, h, s, :] = softmax_j(scale * q[b, h, s, :] · k[b, h, j, :] (+ bias[b, h, s, j])) @ v[b, h, j, :]
//
// q, k, v, bias and y are the tensors the model has (e.g. q, k and v all the QKV Linear's output
// [B, S, 3 * H * D]); each operand is read through a strided view of its tensor given in attrs, so
// the head split, the transposes and the head merge cost no kernel:
//   attrs = [B, H, Sq, Sk, D, Dv,
//            q_offset, q_stride_b, q_stride_h, q_stride_s,  k_offset, k_stride_b, k_stride_h, k_stride_s,
//            v_offset, v_stride_b, v_stride_h, v_stride_s,  y_stride_b, y_stride_h, y_stride_s,
//            bias_stride_b, bias_stride_h, bias_stride_sq, bias_stride_sk,  scale (float32 bits)]
// in elements; the head dimension is contiguous (stride 1) everywhere; a bias stride of 0 broadcasts
// (a [B, 1, 1, Sk] padding mask). fp32, fp16 or bf16 in and out (the bias in the same dtype or fp32),
// fp32 softmax and accumulation.
//
// Three kernels, all fp32 math, written for batch-1 inference, where a flash kernel's large tiles leave
// most SMs idle (cuDNN's fused attention has no fp32 path). The first two use the online softmax (running
// max and sum per row), so any Sk fits. The workspace is unused (the vendor calling convention).
// - nimble.attention.sdpa / sdpa_bias: the row-per-warp kernel, one query row per warp, key tiles
//   through shared memory, the next tile fetched into registers while the current one is computed on.
//   Checked against float64 and timed on an H100 (scripts/experiments/attention_check.py); latency-bound
//   at batch 1 (one 32-key tile 3.6 us, each further one 1.3 us: 27 us for ViT-B's 197 keys).
// - nimble.attention.split_sdpa / split_sdpa_bias (same attrs): for head dimensions up to 64 (ViT, BERT)
//   the split-key kernel: a block takes R query rows and up to eight warps; warp w takes key tiles
//   w, w + 8, ... (32 keys, one per lane) for all R rows, so a warp's tiles do not wait on each other and
//   each lane works on R rows at once; the warps' partials (max, sum, weighted values) are combined
//   through shared memory at the end. R (16, 8 or 4) is chosen from the grid's waves over the GPU's SMs
//   (LaunchSplitRows). Larger heads take the row-per-warp kernel. On the H200 (fifteenth session,
//   attention_check) it matches float64 as closely as ours, but is faster only for ViT-S-sized and long
//   sequences (H100, sixteenth session: ViT-S 15.5 vs 17.7 us); its provider (attention_split) is one of the
//   candidates the kernel choice measures against ours per operator (ViT-S fp32 takes it).
// - nimble.attention.tile_sdpa / tile_sdpa_bias (same attrs): the tile kernel, for when the whole head's K
//   (then V) fits shared memory. Both kernels above are shared-memory bound, about one shared load per FMA
//   (ViT-B: 26.7 us, ~4.5 TFLOP/s for 119 MFLOP). This one computes S = Q·Kᵀ and O = P·V as two small SIMT
//   GEMMs: a block takes one (batch, head) and R query rows, stages Q and all of K, each thread computes
//   an R/4 x 4 micro-tile of S from float4 shared loads (R/4 + 4 loads per 4 R FMAs), an exact softmax
//   per row (no online rescaling: all keys are there), V is loaded over K and each thread computes an
//   R/4 x 4 micro-tile of O over a quarter of the keys (the quarters summed by shuffles). R (8, 16 or 32)
//   is chosen by the work on the busiest SM (LaunchTileRows); when no R fits the device's shared memory (227 KB a block on an
//   H100: beyond about 750 keys at D = 64, 400 at D = 128) the call runs the row-per-warp kernel. On an
//   H100 (sixteenth session, attention_check) it matches float64 like ours (fp32 3.0e-7) and takes ViT-B's
//   shape in 21.4 us (ours 26.4) and ViT-S at batch 8 in 48 us (78), but a small grid pays a fixed ~7 us
//   (one block: 7.6 us, ours 3.5), so it too is a candidate measured per operator (ViT-B takes it).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

constexpr const char* kSdpa = "nimble.attention.sdpa";
constexpr const char* kSdpaBias = "nimble.attention.sdpa_bias";
constexpr const char* kSplit = "nimble.attention.split_sdpa";
constexpr const char* kSplitBias = "nimble.attention.split_sdpa_bias";
constexpr const char* kTile = "nimble.attention.tile_sdpa";
constexpr const char* kTileBias = "nimble.attention.tile_sdpa_bias";
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
  const T* kb = k + p.k_off + b * p.k_sb + h * p.k_sh;
  const T* vb = v + p.v_off + b * p.v_sb + h * p.v_sh;
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
        if (d < Dv) o[b * p.o_sb + h * p.o_sh + s * p.o_ss + d] = FromF<T>(acc[r][c] / sum[r]);
      }
    }
  }
}

// ---- the split-key kernel (D, Dv <= 64) ----
constexpr int kSplitWarps = 8;
constexpr int kSplitValueRows = 8;  // value rows of a tile loaded at once in P·V

// 4 consecutive elements of a row as floats, zero past n (vector loads when the caller knows the row
// and d are 16-byte (fp32) / 8-byte (16-bit) aligned and d + 4 <= n)
template <typename T>
__device__ __forceinline__ float4 Load4(const T* row, int d, int n, bool vec) {
  if (vec && d + 4 <= n) {
    if constexpr (sizeof(T) == 4) {
      return *reinterpret_cast<const float4*>(row + d);
    } else {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + d);
      const T* h = reinterpret_cast<const T*>(&raw);
      return make_float4(ToF(h[0]), ToF(h[1]), ToF(h[2]), ToF(h[3]));
    }
  }
  return make_float4(d < n ? ToF(row[d]) : 0.0f, d + 1 < n ? ToF(row[d + 1]) : 0.0f,
                     d + 2 < n ? ToF(row[d + 2]) : 0.0f, d + 3 < n ? ToF(row[d + 3]) : 0.0f);
}

template <typename T, typename M, int DC, int R>  // DC: columns per lane (1 or 2); R: query rows per block
__global__ void __launch_bounds__(kSplitWarps * 32) SdpaSplitKernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                   const T* __restrict__ v, const M* __restrict__ m,
                                                                   T* __restrict__ o, SdpaParams p, bool vec_k) {
  constexpr int W = 32 * DC;  // padded head width
  static_assert(R % 4 == 0, "the probabilities are read four rows at a time");
  __shared__ __align__(16) float Qs[R][W];
  // per warp: first its tile's probabilities P[j][r] (read as float4 broadcasts over r; rows PS apart,
  // not R: lane j writes row j, and a stride of R would put the 32 lanes on two banks), then its
  // partial output A[r][d] (a warp writes A only after its last use of P)
  constexpr int PS = R + 4, SCRATCH = 32 * PS > R * W ? 32 * PS : R * W;
  __shared__ __align__(16) float Scratch[kSplitWarps][SCRATCH];
  __shared__ float Ms[kSplitWarps][R], Ls[kSplitWarps][R];
  const int64_t b = blockIdx.z, h = blockIdx.y, row0 = int64_t(blockIdx.x) * R;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int D = int(p.D), Dv = int(p.Dv);
  const T* qb = q + p.q_off + b * p.q_sb + h * p.q_sh;
  const T* kb = k + p.k_off + b * p.k_sb + h * p.k_sh;
  const T* vb = v + p.v_off + b * p.v_sb + h * p.v_sh;
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
  for (int64_t t = warp; t < tiles; t += warps) {
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
  __syncthreads();
  for (int i = threadIdx.x; i < R * Dv; i += blockDim.x) {  // combine the warps' partials
    const int r = i / Dv, d = i % Dv;
    const int64_t s = row0 + r;
    if (s >= p.Sq) continue;
    float M = -INFINITY;
    for (int w = 0; w < warps; ++w) M = fmaxf(M, Ms[w][r]);
    float L = 0.0f, O = 0.0f;
    for (int w = 0; w < warps; ++w) {
      const float wt = Ms[w][r] == -INFINITY ? 0.0f : expf(Ms[w][r] - M);
      L += wt * Ls[w][r];
      O += wt * Scratch[w][r * W + d];
    }
    o[b * p.o_sb + h * p.o_sh + s * p.o_ss + d] = FromF<T>(O / L);
  }
}

int SmCount() {  // of the current device, asked once per device (a launch may be under stream capture)
  static int counts[64] = {0};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 132;
  if (counts[dev] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    counts[dev] = n > 0 ? n : 132;
  }
  return counts[dev];
}

template <typename T, typename M, int DC, int R>
struct SplitLaunch {  // one instantiation of the split-key kernel: its grid and how many of its blocks an SM holds
  static int Warps(const SdpaParams& p) { return int(std::min<int64_t>(kSplitWarps, (p.Sk + 31) / 32)); }
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
  static void Launch(const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y, cudaStream_t stream) {
    dim3 grid(unsigned((p.Sq + R - 1) / R), unsigned(p.H), unsigned(p.B));
    const size_t align = sizeof(T) == 4 ? 16 : 8;  // a row's 4-element vector loads
    const bool vec_k = reinterpret_cast<uintptr_t>(k + p.k_off) % align == 0 && p.k_sb % 4 == 0 && p.k_sh % 4 == 0 &&
                       p.k_ss % 4 == 0;
    SdpaSplitKernel<T, M, DC, R><<<grid, Warps(p) * 32, 0, stream>>>(q, k, v, m, y, p, vec_k);
  }
};

// R: the fewest waves of blocks over the SMs first (a second, partial wave costs a whole block's time),
// then a grid that has a block for every SM, then the most rows per block (K and V read fewer times).
template <typename T, typename M, int DC>
void LaunchSplitRows(const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y, cudaStream_t stream) {
  const int64_t sms = SmCount();
  auto score = [&](int64_t blocks, int per_sm, int rows) {
    const int64_t waves = (blocks + sms * per_sm - 1) / (sms * per_sm);
    return std::make_tuple(waves, blocks < sms ? 1 : 0, -rows);
  };
  const auto s16 = score(SplitLaunch<T, M, DC, 16>::Blocks(p), SplitLaunch<T, M, DC, 16>::PerSm(p), 16);
  const auto s8 = score(SplitLaunch<T, M, DC, 8>::Blocks(p), SplitLaunch<T, M, DC, 8>::PerSm(p), 8);
  const auto s4 = score(SplitLaunch<T, M, DC, 4>::Blocks(p), SplitLaunch<T, M, DC, 4>::PerSm(p), 4);
  if (s16 <= s8 && s16 <= s4) SplitLaunch<T, M, DC, 16>::Launch(p, q, k, v, m, y, stream);
  else if (s8 <= s4) SplitLaunch<T, M, DC, 8>::Launch(p, q, k, v, m, y, stream);
  else SplitLaunch<T, M, DC, 4>::Launch(p, q, k, v, m, y, stream);
}

// ---- the tile kernel: Q·Kᵀ and P·V as two small register-blocked SIMT GEMMs over shared memory ----
constexpr int kTileThreads = 256, kTileWarps = kTileThreads / 32;
constexpr int kTileBatch = 8;  // float4 loads a thread has in flight while staging a tensor into shared memory
constexpr int64_t kTileMaxKeys = 16384;  // more keys never fit shared memory (each key row takes >= 16 bytes)

// A row pitch (in floats, a multiple of 4) of an odd number of float4s: 8 consecutive rows read at one column
// as float4s (a quarter-warp's 128-bit loads) fall on distinct banks.
__host__ __device__ inline int OddQuads(int n) { return (n / 4) % 2 ? n : n + 4; }

struct TileLayout {  // the tile kernel's shared memory, in floats; every row and section 16-byte aligned
  int dp, kp, vdp, skp, sp;  // D, Dv and Sk rounded up to 4; kp: Q and K row pitch; sp: S row pitch (V's is vdp)
  int q_at, kv_at, s_at, l_at, total;  // Q (R x kp), K then V (skp x kp, then skp x vdp), S (R x sp), row sums (R)
};

// Sk <= kTileMaxKeys and D, Dv <= 128 (CheckSdpa): every size below fits an int.
inline TileLayout MakeTileLayout(int rows, int64_t Sk, int64_t D, int64_t Dv) {
  TileLayout l;
  l.dp = int(D + 3) / 4 * 4;
  l.kp = OddQuads(l.dp);
  l.vdp = int(Dv + 3) / 4 * 4;
  l.skp = int(Sk + 3) / 4 * 4;
  l.sp = OddQuads(l.skp);
  l.q_at = 0;
  l.kv_at = rows * l.kp;
  l.s_at = l.kv_at + l.skp * std::max(l.kp, l.vdp);
  l.l_at = l.s_at + rows * l.sp;
  l.total = l.l_at + (rows + 3) / 4 * 4;
  return l;
}

// N float4s of a [rows, quads] grid of float4s (float4 i: row i / quads, columns 4 * (i % quads) ..), thread-strided
// from i0; rows from `valid` on and columns from n on are zeros.
template <typename T, int N>
struct Staged {
  float4 x[N];
  __device__ __forceinline__ void Load(const T* src, int64_t stride, int valid, int n, int quads, int total, int i0,
                                       bool vec) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int i = i0 + u * kTileThreads, r = i / quads, c = 4 * (i % quads);
      x[u] = i < total && r < valid ? Load4(src + r * stride, c, n, vec) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  __device__ __forceinline__ void Store(float* dst, int pitch, int quads, int total, int i0, float scale) const {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const int i = i0 + u * kTileThreads, r = i / quads, c = 4 * (i % quads);
      if (i < total) {
        *reinterpret_cast<float4*>(dst + r * pitch + c) =
            make_float4(x[u].x * scale, x[u].y * scale, x[u].z * scale, x[u].w * scale);
      }
    }
  }
};

// rows x quads float4s of src (rows `stride` elements apart) into dst (rows `pitch` floats apart), from float4 i0 on
template <typename T>
__device__ __forceinline__ void StageRows(float* dst, int pitch, const T* src, int64_t stride, int valid, int rows,
                                          int n, int quads, bool vec, float scale, int i0) {
  const int total = rows * quads;
  for (; i0 < total; i0 += kTileBatch * kTileThreads) {
    Staged<T, kTileBatch> s;
    s.Load(src, stride, valid, n, quads, total, i0, vec);
    s.Store(dst, pitch, quads, total, i0, scale);
  }
}

// One block: one (batch, head) and R query rows, all of the head's keys in shared memory at once.
//  1. Q's R rows (scaled) and all of K staged (zeros pad D to dp, Sk to skp and rows past Sq).
//  2. S = Q·Kᵀ [R, skp]: a thread's micro-tile is TM = R / 4 rows x 4 keys (kg + i * skp / 4: 8 neighbouring
//     threads read 8 neighbouring K rows, on distinct banks by the pitch), float4 loads over d: TM + 4 shared
//     loads per 16 TM FMAs (the row-per-warp kernel does about one per FMA).
//  3. V's first float4s are fetched into registers; after the barrier (K consumed) each warp takes rows
//     warp, warp + 8, ...: the mask added, the exact softmax (max, exp, sum; P left unnormalised in S, zeros
//     past Sk), then V is stored over K.
//  4. O = P·V [R, vdp]: a thread's micro-tile is TM rows x 4 columns; the four quarter-warps (ks = lane / 8)
//     take every fourth group of 4 keys and are summed by two shuffles; each writes a quarter of the rows,
//     divided by the row sums (a row whose scores are all -inf has sum 0: NaN, as in the other kernels).
// vec: bit 0, 1, 2: q, k, v rows may be read as aligned 4-element vectors (Load4).
template <typename T, typename M, int R>
__global__ void __launch_bounds__(kTileThreads, 2) SdpaTileKernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                 const T* __restrict__ v, const M* __restrict__ m,
                                                                 T* __restrict__ o, SdpaParams p, TileLayout L,
                                                                 int vec) {
  static_assert(R % 4 == 0 && R >= 4, "four row groups of R / 4 rows");
  constexpr int TM = R / 4;
  extern __shared__ __align__(16) float tile_smem[];
  float* Qs = tile_smem + L.q_at;
  float* KV = tile_smem + L.kv_at;
  float* S = tile_smem + L.s_at;
  float* Ls = tile_smem + L.l_at;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, row0 = int64_t(blockIdx.x) * R;
  const int Sk = int(p.Sk), D = int(p.D), Dv = int(p.Dv);
  const int rows = int(p.Sq - row0 < R ? p.Sq - row0 : R);  // the block's rows inside Sq (>= 1)
  const T* qb = q + p.q_off + b * p.q_sb + h * p.q_sh + row0 * p.q_ss;
  const T* kb = k + p.k_off + b * p.k_sb + h * p.k_sh;
  const T* vb = v + p.v_off + b * p.v_sb + h * p.v_sh;
  const M* mb = m ? m + b * p.m_sb + h * p.m_sh : nullptr;
  const int dq = L.dp / 4, vq = L.vdp / 4, nkg = L.skp / 4;

  // 1. stage Q and K
  StageRows(Qs, L.kp, qb, p.q_ss, rows, R, D, dq, vec & 1, p.scale, tid);
  StageRows(KV, L.kp, kb, p.k_ss, Sk, L.skp, D, dq, vec & 2, 1.0f, tid);
  __syncthreads();

  // 2. S = Q·Kᵀ
  for (int t = tid; t < 4 * nkg; t += kTileThreads) {
    const int kg = t % nkg, r0 = (t / nkg) * TM;
    const float* qr = Qs + r0 * L.kp;
    const float* kr = KV + kg * L.kp;
    const int kstep = nkg * L.kp;
    float acc[TM][4];
#pragma unroll
    for (int mm = 0; mm < TM; ++mm) acc[mm][0] = acc[mm][1] = acc[mm][2] = acc[mm][3] = 0.0f;
#pragma unroll 2
    for (int d = 0; d < L.dp; d += 4) {
      float4 kv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) kv[i] = *reinterpret_cast<const float4*>(kr + i * kstep + d);
#pragma unroll
      for (int mm = 0; mm < TM; ++mm) {
        const float4 qv = *reinterpret_cast<const float4*>(qr + mm * L.kp + d);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[mm][i] = fmaf(qv.w, kv[i].w, fmaf(qv.z, kv[i].z, fmaf(qv.y, kv[i].y, fmaf(qv.x, kv[i].x, acc[mm][i]))));
        }
      }
    }
#pragma unroll
    for (int mm = 0; mm < TM; ++mm) {
#pragma unroll
      for (int i = 0; i < 4; ++i) S[(r0 + mm) * L.sp + kg + i * nkg] = acc[mm][i];
    }
  }

  // 3. softmax, V fetched meanwhile
  const int vtotal = L.skp * vq;
  Staged<T, kTileBatch> vfirst;
  vfirst.Load(vb, p.v_ss, Sk, Dv, vq, vtotal, tid, vec & 4);
  __syncthreads();  // K consumed, S complete
  for (int r = warp; r < R; r += kTileWarps) {
    float* sr = S + r * L.sp;
    const M* mr = mb && r < rows ? mb + (row0 + r) * p.m_sq : nullptr;  // rows past Sq: no mask, not written
    float mx = -INFINITY;
    for (int j = lane; j < Sk; j += 32) {
      float x = sr[j];
      if (mr) x += ToF(mr[j * p.m_sk]);
      sr[j] = x;
      mx = fmaxf(mx, x);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float sum = 0.0f;
    for (int j = lane; j < L.skp; j += 32) {  // zeros past Sk (and for a row of -inf scores)
      const float e = j < Sk && mx != -INFINITY ? expf(sr[j] - mx) : 0.0f;
      sr[j] = e;
      sum += e;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) Ls[r] = sum;
  }
  vfirst.Store(KV, L.vdp, vq, vtotal, tid, 1.0f);
  StageRows(KV, L.vdp, vb, p.v_ss, Sk, L.skp, Dv, vq, vec & 4, 1.0f, tid + kTileBatch * kTileThreads);
  __syncthreads();

  // 4. O = P·V
  const int ntile = 4 * vq, ks = lane >> 3, nc = L.skp / 4;
  T* ob = o + b * p.o_sb + h * p.o_sh + row0 * p.o_ss;
  for (int base = warp * 8; base < ntile; base += kTileWarps * 8) {  // warp-uniform: every lane reaches the shuffles
    const int tile = base + (lane & 7);
    const bool active = tile < ntile;
    const int cq = tile % vq, r0 = (tile / vq) * TM;
    float acc[TM][4];
#pragma unroll
    for (int mm = 0; mm < TM; ++mm) acc[mm][0] = acc[mm][1] = acc[mm][2] = acc[mm][3] = 0.0f;
    if (active) {
      const float* pr = S + r0 * L.sp;
      const float* vr = KV + 4 * cq;
#pragma unroll 2
      for (int c = ks; c < nc; c += 4) {
        const int j = 4 * c;
        float4 vv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) vv[i] = *reinterpret_cast<const float4*>(vr + (j + i) * L.vdp);
#pragma unroll
        for (int mm = 0; mm < TM; ++mm) {
          const float4 pv = *reinterpret_cast<const float4*>(pr + mm * L.sp + j);
          acc[mm][0] = fmaf(pv.w, vv[3].x, fmaf(pv.z, vv[2].x, fmaf(pv.y, vv[1].x, fmaf(pv.x, vv[0].x, acc[mm][0]))));
          acc[mm][1] = fmaf(pv.w, vv[3].y, fmaf(pv.z, vv[2].y, fmaf(pv.y, vv[1].y, fmaf(pv.x, vv[0].y, acc[mm][1]))));
          acc[mm][2] = fmaf(pv.w, vv[3].z, fmaf(pv.z, vv[2].z, fmaf(pv.y, vv[1].z, fmaf(pv.x, vv[0].z, acc[mm][2]))));
          acc[mm][3] = fmaf(pv.w, vv[3].w, fmaf(pv.z, vv[2].w, fmaf(pv.y, vv[1].w, fmaf(pv.x, vv[0].w, acc[mm][3]))));
        }
      }
    }
#pragma unroll
    for (int mm = 0; mm < TM; ++mm) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[mm][e] += __shfl_xor_sync(0xffffffffu, acc[mm][e], 8);
        acc[mm][e] += __shfl_xor_sync(0xffffffffu, acc[mm][e], 16);
      }
    }
    if (active) {
#pragma unroll
      for (int mm = 0; mm < TM; ++mm) {
        const int r = r0 + mm;
        if ((mm & 3) == ks && r < rows) {
          const float l = Ls[r];
          T* orow = ob + r * p.o_ss + 4 * cq;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (4 * cq + e < Dv) orow[e] = FromF<T>(acc[mm][e] / l);
          }
        }
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

// ---- the tile kernel's launch ----
int SmemOptin() {  // a block's opt-in maximum of shared memory on the current device, in bytes, asked once per device
  static std::atomic<int> optin[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return 48 << 10;
  if (optin[dev].load(std::memory_order_relaxed) == 0) {
    int a = 0;
    cudaDeviceGetAttribute(&a, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    optin[dev].store(a > 0 ? a : 48 << 10, std::memory_order_relaxed);
  }
  return optin[dev].load(std::memory_order_relaxed);
}

template <typename T, typename M, int R>
struct TileLaunch {  // one instantiation of the tile kernel
  static int64_t Blocks(const SdpaParams& p) { return (p.Sq + R - 1) / R * p.H * p.B; }
  static size_t Bytes(const SdpaParams& p) { return size_t(MakeTileLayout(R, p.Sk, p.D, p.Dv).total) * sizeof(float); }
  static void Launch(const char* op, const SdpaParams& p, int optin, const T* q, const T* k, const T* v,
                     const M* m, T* y, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};  // devices whose attributes are set (per device and function)
    int dev = 0;
    cudaGetDevice(&dev);
    const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
    if (!bit || !(configured.load(std::memory_order_relaxed) & bit)) {
      CheckCuda(cudaFuncSetAttribute(SdpaTileKernel<T, M, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
                op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      // shared memory first: the kernel reads global memory once, and a small carveout would keep blocks apart
      CheckCuda(cudaFuncSetAttribute(SdpaTileKernel<T, M, R>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)),
                op, "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
      configured.fetch_or(bit, std::memory_order_relaxed);
    }
    auto vec = [](const T* base, int64_t off, int64_t sb, int64_t sh, int64_t ss) {  // aligned 4-element rows
      const size_t align = sizeof(T) == 4 ? 16 : 8;
      return reinterpret_cast<uintptr_t>(base + off) % align == 0 && sb % 4 == 0 && sh % 4 == 0 && ss % 4 == 0;
    };
    const int vec_bits = (vec(q, p.q_off, p.q_sb, p.q_sh, p.q_ss) ? 1 : 0) |
                         (vec(k, p.k_off, p.k_sb, p.k_sh, p.k_ss) ? 2 : 0) |
                         (vec(v, p.v_off, p.v_sb, p.v_sh, p.v_ss) ? 4 : 0);
    dim3 grid(unsigned((p.Sq + R - 1) / R), unsigned(p.H), unsigned(p.B));
    SdpaTileKernel<T, M, R><<<grid, kTileThreads, Bytes(p), stream>>>(q, k, v, m, y, p,
                                                                      MakeTileLayout(R, p.Sk, p.D, p.Dv), vec_bits);
  }
};

// R (8, 16 or 32 rows per block): the least work on the busiest SM, ceil(blocks / SMs) x (R + 8), the 8 standing
// for a block's fixed cost (staging the whole head's K and V), ties to the larger R. Fitted on the H100's per-R
// timings of every attention_check case (sixteenth session): it picks the fastest R or one within 3% of it, where
// LaunchSplitRows' rule (fewest waves, then most rows) took R = 32 for small grids, up to 1.6x slower than R = 8.
// NIMBLE_ATTENTION_TILE_ROWS=8|16|32 forces R (for experiments: scripts/experiments/attention_check.py times each).
// Only R whose shared memory fits the device (K or V for the whole head, the scores for R rows); false when none
// does: the caller runs the row-per-warp kernel.
template <typename T, typename M>
bool LaunchTileRows(const char* op, const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y,
                    cudaStream_t stream) {
  if (p.Sk > kTileMaxKeys) return false;
  const int optin = SmemOptin();
  const int64_t sms = SmCount();
  const bool fit32 = TileLaunch<T, M, 32>::Bytes(p) <= size_t(optin);
  const bool fit16 = TileLaunch<T, M, 16>::Bytes(p) <= size_t(optin);
  const bool fit8 = TileLaunch<T, M, 8>::Bytes(p) <= size_t(optin);
  if (!fit8) return false;  // the smallest R fits whenever any does
  const char* env = std::getenv("NIMBLE_ATTENTION_TILE_ROWS");
  int rows = env ? std::atoi(env) : 0;
  if (!((rows == 32 && fit32) || (rows == 16 && fit16) || rows == 8)) {
    constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    auto score = [&](bool fits, int64_t blocks, int r) {
      if (!fits) return std::make_tuple(kNever, 0);
      return std::make_tuple((blocks + sms - 1) / sms * (r + 8), -r);
    };
    const auto s32 = score(fit32, TileLaunch<T, M, 32>::Blocks(p), 32);
    const auto s16 = score(fit16, TileLaunch<T, M, 16>::Blocks(p), 16);
    const auto s8 = score(true, TileLaunch<T, M, 8>::Blocks(p), 8);
    rows = s32 <= s16 && s32 <= s8 ? 32 : s16 <= s8 ? 16 : 8;
  }
  if (rows == 32) TileLaunch<T, M, 32>::Launch(op, p, optin, q, k, v, m, y, stream);
  else if (rows == 16) TileLaunch<T, M, 16>::Launch(op, p, optin, q, k, v, m, y, stream);
  else TileLaunch<T, M, 8>::Launch(op, p, optin, q, k, v, m, y, stream);
  return true;
}

enum class Kernel { kRowPerWarp, kSplitKey, kTile };

template <typename T, typename M>
void LaunchSdpa(const char* op, const SdpaParams& p, const void* q, const void* k, const void* v, const void* m,
                void* y, Kernel kernel, cudaStream_t stream) {
  const auto* qt = static_cast<const T*>(q);
  const auto* kt = static_cast<const T*>(k);
  const auto* vt = static_cast<const T*>(v);
  const auto* mt = static_cast<const M*>(m);
  auto* yt = static_cast<T*>(y);
  if (kernel == Kernel::kTile && LaunchTileRows<T, M>(op, p, qt, kt, vt, mt, yt, stream)) return;
  const bool split = kernel == Kernel::kSplitKey;
  const int dc = int((std::max(p.D, p.Dv) + 31) / 32);  // columns per lane of q, k and v
  if (split && dc == 1) LaunchSplitRows<T, M, 1>(p, qt, kt, vt, mt, yt, stream);
  else if (split && dc == 2) LaunchSplitRows<T, M, 2>(p, qt, kt, vt, mt, yt, stream);
  else if (dc == 1) LaunchSdpaDC<T, M, 1>(p, qt, kt, vt, mt, yt, stream);
  else if (dc == 2) LaunchSdpaDC<T, M, 2>(p, qt, kt, vt, mt, yt, stream);
  else if (dc == 3) LaunchSdpaDC<T, M, 3>(p, qt, kt, vt, mt, yt, stream);
  else LaunchSdpaDC<T, M, 4>(p, qt, kt, vt, mt, yt, stream);
}

void SdpaImpl(const char* op, TensorView q, TensorView k, TensorView v, const TensorView* bias, const Shape& attrs,
              TensorView y, TensorView workspace, Kernel kernel = Kernel::kRowPerWarp) {
  int dtype = 0;
  const SdpaParams p = CheckSdpa(op, q, k, v, bias, attrs, y, workspace, &dtype);
  const int dev = q.device().device_id;
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  const void* mp = bias ? DataPtr(*bias) : nullptr;
  const bool f32_mask = bias && dtype != kF32 && TensorDType(*bias) == kF32;  // a 16-bit model's fp32 mask
  if (dtype == kF32) {
    LaunchSdpa<float, float>(op, p, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), kernel, stream);
  } else if (dtype == kF16) {
    if (f32_mask) LaunchSdpa<__half, float>(op, p, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), kernel, stream);
    else LaunchSdpa<__half, __half>(op, p, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), kernel, stream);
  } else {
    if (f32_mask) LaunchSdpa<__nv_bfloat16, float>(op, p, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), kernel, stream);
    else LaunchSdpa<__nv_bfloat16, __nv_bfloat16>(op, p, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), kernel, stream);
  }
  CheckCuda(cudaGetLastError(), op, "attention kernel launch");
}

void Sdpa(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kSdpa, q, k, v, nullptr, attrs, y, workspace);
}

void SdpaBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
              TensorView workspace) {
  SdpaImpl(kSdpaBias, q, k, v, &bias, attrs, y, workspace);
}

void Split(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kSplit, q, k, v, nullptr, attrs, y, workspace, Kernel::kSplitKey);
}

void SplitBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
               TensorView workspace) {
  SdpaImpl(kSplitBias, q, k, v, &bias, attrs, y, workspace, Kernel::kSplitKey);
}

void Tile(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kTile, q, k, v, nullptr, attrs, y, workspace, Kernel::kTile);
}

void TileBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
              TensorView workspace) {
  SdpaImpl(kTileBias, q, k, v, &bias, attrs, y, workspace, Kernel::kTile);
}

__attribute__((constructor)) void RegisterAttention() {
  try {
    Register(kSdpa, Sdpa);
    Register(kSdpaBias, SdpaBias);
    Register(kSplit, Split);
    Register(kSplitBias, SplitBias);
    Register(kTile, Tile);
    Register(kTileBias, TileBias);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
