// The register-tiled fused attention kernel (nimble.attention.tile_sdpa / tile_sdpa_bias: attention.cu's calls, which
// register them and launch this one through LaunchTileF32 / F16 / BF16) and its launch, shared by the units that
// instantiate it for one dtype each (attention_tile_f32.cu, attention_tile_f16.cu, attention_tile_bf16.cu: they
// compile side by side, where one unit of every dtype was among the extension's slowest device units).
//
// attention.cu's two kernels are shared-memory bound, about one shared load per FMA (ViT-B: 26.7 us, ~4.5
// TFLOP/s for 119 MFLOP). This one computes S = Q·Kᵀ and O = P·V as two small SIMT GEMMs: a block takes one
// (batch, head) and R query rows, stages Q and all of K, each thread computes an R/4 x 4 micro-tile of S from
// float4 shared loads (R/4 + 4 loads per 4 R FMAs), an exact softmax per row (no online rescaling: all keys are
// there), V is loaded over K and each thread computes an R/4 x 4 micro-tile of O over a quarter of the keys (the
// quarters summed by shuffles). R (8, 16 or 32) is chosen by the work on the busiest SM (LaunchTileRows); when no
// R fits the device's shared memory (227 KB a block on an H100: beyond about 750 keys at D = 64, 400 at D = 128)
// the call runs the row-per-warp kernel. It matches float64 like the others and is faster on large grids, but a
// small grid pays a fixed cost, so it is a candidate the kernel choice measures per operator (see
// benchmarks/findings.md, 'Attention kernels, build times, serving googlenet, PyTorch's half precision by layout').
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <tuple>

#include "attention_kernels.h"
#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

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
  const T* kb = k + p.k_off + b * p.k_sb + (h / p.group) * p.k_sh;
  const T* vb = v + p.v_off + b * p.v_sb + (h / p.group) * p.v_sh;
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
            if (4 * cq + e < Dv) orow[e] = FromF<T>(Normalised(acc[mm][e], l));
          }
        }
      }
    }
  }
}

// ---- the tile kernel's launch ----
int SmemOptin() {  // a block's opt-in maximum of shared memory on the current device, in bytes
  return DeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(48 << 10);
}

template <typename T, typename M, int R>
struct TileLaunch {  // one instantiation of the tile kernel
  static int64_t Blocks(const SdpaParams& p) { return (p.Sq + R - 1) / R * p.H * p.B; }
  static size_t Bytes(const SdpaParams& p) { return size_t(MakeTileLayout(R, p.Sk, p.D, p.Dv).total) * sizeof(float); }
  static void Launch(const char* op, const SdpaParams& p, int optin, const T* q, const T* k, const T* v,
                     const M* m, T* y, cudaStream_t stream) {
    static std::atomic<uint64_t> configured{0};  // devices whose attributes are set (per device and function)
    OncePerDevice(configured, [&] {  // each call raises on failure, with its own message
      CheckCuda(cudaFuncSetAttribute(SdpaTileKernel<T, M, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin),
                op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      // shared memory first: the kernel reads global memory once, and a small carveout would keep blocks apart
      CheckCuda(cudaFuncSetAttribute(SdpaTileKernel<T, M, R>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)),
                op, "cudaFuncSetAttribute(PreferredSharedMemoryCarveout)");
      return cudaSuccess;
    });
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
// for a block's fixed cost (staging the whole head's K and V), ties to the larger R. Fitted to H100 per-R timings
// of every attention_check case: it picks the fastest R or one within 3% of it, where LaunchSplitRows' rule (fewest
// waves, then most rows) took R = 32 for small grids, far slower than R = 8 (see benchmarks/findings.md, 'Attention
// kernels, build times, serving googlenet, PyTorch's half precision by layout').
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

// The tile kernel on q, k, v of T and the mask of M; false when no R fits (nothing launched).
template <typename T, typename M>
bool LaunchTileTyped(const char* op, const SdpaParams& p, const void* q, const void* k, const void* v, const void* m,
                     void* y, cudaStream_t stream) {
  return LaunchTileRows<T, M>(op, p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                              static_cast<const M*>(m), static_cast<T*>(y), stream);
}

}  // namespace
}  // namespace nimble_vendor
