// A decode step's attention, split from attention.cu so that the two compile side by side (each unit is one nvcc
// process; attention.cu alone was the extension's slowest device unit):
//
//   nimble.attention.append_sdpa_bias(q, k_cache, v_cache, bias, k_new, v_new, positions, attrs, y, workspace)
//   nimble.attention.append_rope_sdpa_bias(q, k_cache, v_cache, bias, k_new, v_new, positions, cos, sin, attrs, y,
//                                          workspace)
//
// (described with the other attention calls at the top of attention.cu), and the decode kernel that every attention
// call of one query row per head runs (LaunchDecodeAttention, attention_kernels.h).
#include <cooperative_groups.h>

#include <cstdint>
#include <string>

#include "attention_kernels.h"
#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

constexpr const char* kAppendBias = "nimble.attention.append_sdpa_bias";
constexpr const char* kAppendRopeBias = "nimble.attention.append_rope_sdpa_bias";

// ---- the decode kernel: one query row per (batch, head), D = Dv in {64, 128} ----
// A decode step's attention is a few hundred keys per head: latency, not work. Each thread keeps its own online
// softmax (max, sum, E weighted value columns, E = 16 bytes of elements) over the keys it is given, so no barrier is
// taken per key tile: a key is read by D / E lanes, each one 16-byte load of K and one of V, issued together (one
// memory round trip per chunk of keys, the next chunk's loads in flight while the current one is computed), the
// score reduced over those lanes by shuffles. The block's key groups, then the blocks of a thread-block cluster
// (the keys split over up to 8 blocks), are merged at the end, in a fixed order (deterministic).
constexpr int kDecodeThreads = 128;
constexpr int kDecodeKeysPerThread = 2;  // keys a thread reads per chunk
constexpr const char* kDecode = "nimble.attention (decode kernel)";

// A decode step's new key and value (append_sdpa_bias): [B, KV heads, D] each, written into the caches (the kernel's k
// and v) at slot pos[b]; every block reads them where the cache would hold them.
// With cos / sin (fp32 [B, D]), q and k_new are rotated first (append_rope_sdpa_bias).
template <typename T>
struct CacheAppend {
  const T* k_new = nullptr;
  const T* v_new = nullptr;
  const int64_t* pos = nullptr;
  T* k_cache = nullptr;
  T* v_cache = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// Element d of row x (D elements) rotated: x[d] * cos[d] + rotate_half(x)[d] * sin[d] in fp32, rounded to T.
template <typename T>
__device__ __forceinline__ T Rotated(const T* x, const float* cos, const float* sin, int64_t d, int64_t D) {
  const int64_t half = D / 2;
  const float r = d < half ? -ToF(x[d + half]) : ToF(x[d - half]);
  return FromF<T>(__fadd_rn(__fmul_rn(ToF(x[d]), cos[d]), __fmul_rn(r, sin[d])));
}

// The 16 bytes of row x (D elements) at columns c .. c + 16 / sizeof(T), rotated (Rotated); c + that within one half.
template <typename T>
__device__ __forceinline__ uint4 Rotated16B(const T* x, const float* cos, const float* sin, int64_t c, int64_t D) {
  constexpr int E = 16 / sizeof(T);
  const int64_t half = D / 2, other = c < half ? c + half : c - half;
  float xf[E], of[E];
  Unpack16B<T>(*reinterpret_cast<const uint4*>(x + c), xf);
  Unpack16B<T>(*reinterpret_cast<const uint4*>(x + other), of);
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int i = 0; i < E; ++i) {
    const float r = c < half ? -of[i] : of[i];
    o[i] = FromF<T>(__fadd_rn(__fmul_rn(xf[i], cos[c + i]), __fmul_rn(r, sin[c + i])));
  }
  return out;
}

template <typename T, typename M, int D, bool kAppend>
__global__ void __launch_bounds__(kDecodeThreads) SdpaDecodeKernel(const T* __restrict__ q, const T* __restrict__ k,
                                                                  const T* __restrict__ v, const M* __restrict__ m,
                                                                  T* __restrict__ o, SdpaParams p, int C,
                                                                  CacheAppend<T> a) {
  constexpr int E = 16 / sizeof(T);                            // elements of a 16-byte load
  constexpr int L = D / E;                                     // lanes per key
  constexpr int G = kDecodeThreads / L;                        // key groups of a block
  constexpr int NK = kDecodeKeysPerThread;
  constexpr int CHUNK = G * NK;                                // keys a block takes per step
  __shared__ float Mg[G], Lg[G], Og[G][D], Mb[1], Lb[1], Ob[D];
  const int rank = C > 1 ? int(blockIdx.x) : 0;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  const int t = threadIdx.x, g = t / L, slot = t % L;          // this thread: key group g, columns E * slot ..
  GridLaunchDependents();  // launched with Pdl(): the next kernel (a GEMV) may load its weights meanwhile
  GridDependencyWait();    // q and the caches are the kernels' before this one
  const int64_t kvh = h / p.group;
  const T* kb = k + p.k_off + b * p.k_sb + kvh * p.k_sh + E * slot;
  const T* vb = v + p.v_off + b * p.v_sb + kvh * p.v_sh + E * slot;
  const M* mb = m ? m + b * p.m_sb + h * p.m_sh : nullptr;
  // the appended key's slot (-1: none) and its new key and value; the first query head of a KV head writes them into
  // the caches (block 0 of its cluster), and no block reads that slot of a cache
  const int64_t at = kAppend ? a.pos[b] : -1;
  const int64_t kv_heads = p.H / p.group;
  // the new key (rotated where cos is given) and value at this thread's columns
  uint4 k_fresh = make_uint4(0, 0, 0, 0), v_fresh = make_uint4(0, 0, 0, 0);
  if (kAppend) {
    const T* kn = a.k_new + (b * kv_heads + kvh) * D;
    k_fresh = a.cos ? Rotated16B<T>(kn, a.cos + b * D, a.sin + b * D, E * slot, D)
                    : *reinterpret_cast<const uint4*>(kn + E * slot);
    v_fresh = *reinterpret_cast<const uint4*>(a.v_new + (b * kv_heads + kvh) * D + E * slot);
  }
  if (kAppend && at >= 0 && at < p.Sk && rank == 0 && h % p.group == 0 && t < L) {
    *reinterpret_cast<uint4*>(a.k_cache + p.k_off + b * p.k_sb + kvh * p.k_sh + at * p.k_ss + E * slot) = k_fresh;
    *reinterpret_cast<uint4*>(a.v_cache + p.v_off + b * p.v_sb + kvh * p.v_sh + at * p.v_ss + E * slot) = v_fresh;
  }
  float qf[E];
  const T* qrow = q + p.q_off + b * p.q_sb + h * p.q_sh;
  Unpack16B<T>(kAppend && a.cos ? Rotated16B<T>(qrow, a.cos + b * D, a.sin + b * D, E * slot, D)
                                : *reinterpret_cast<const uint4*>(qrow + E * slot),
               qf);
  float mx = -INFINITY, l = 0.0f, acc[E];
#pragma unroll
  for (int i = 0; i < E; ++i) acc[i] = 0.0f;
  const int64_t chunks = (p.Sk + CHUNK - 1) / CHUNK;
  uint4 kr[NK], vr[NK];
  auto load = [&](int64_t c) {  // this thread's keys of chunk c: c * CHUNK + n * G + g
#pragma unroll
    for (int n = 0; n < NK; ++n) {
      const int64_t key = c * CHUNK + n * G + g;
      const bool in = c < chunks && key < p.Sk;  // a key past Sk reads zeros (0 * garbage could be NaN)
      const bool fresh = kAppend && key == at;  // the appended key: from k_new / v_new, not the cache
      kr[n] = !in ? make_uint4(0, 0, 0, 0) : fresh ? k_fresh : *reinterpret_cast<const uint4*>(kb + key * p.k_ss);
      vr[n] = !in ? make_uint4(0, 0, 0, 0) : fresh ? v_fresh : *reinterpret_cast<const uint4*>(vb + key * p.v_ss);
    }
  };
  load(rank);
  for (int64_t c = rank; c < chunks; c += C) {
    uint4 kc[NK], vc[NK];
#pragma unroll
    for (int n = 0; n < NK; ++n) kc[n] = kr[n], vc[n] = vr[n];
    load(c + C);  // the next chunk's loads in flight during this one's arithmetic
#pragma unroll
    for (int n = 0; n < NK; ++n) {
      const int64_t key = c * CHUNK + n * G + g;
      const bool valid = key < p.Sk;
      float kf[E], s = 0.0f;
      Unpack16B<T>(kc[n], kf);
#pragma unroll
      for (int i = 0; i < E; ++i) s = fmaf(qf[i], kf[i], s);
#pragma unroll
      for (int off = L / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);  // the key's L lanes
      s = valid ? s * p.scale + (mb ? ToF(mb[key * p.m_sk]) : 0.0f) : -INFINITY;
      const float mnew = fmaxf(mx, s);
      const bool none = mnew == -INFINITY;  // every score so far is -inf: nothing to weigh yet
      const float e = none ? 0.0f : expf(s - mnew), corr = none ? 1.0f : expf(mx - mnew);
      float vf[E];
      Unpack16B<T>(vc[n], vf);
      mx = mnew;
      l = l * corr + e;
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] = fmaf(e, vf[i], acc[i] * corr);
    }
  }
  // the block's key groups: every lane of group g holds the same max and sum
  if (slot == 0) Mg[g] = mx, Lg[g] = l;
#pragma unroll
  for (int i = 0; i < E; ++i) Og[g][E * slot + i] = acc[i];
  __syncthreads();
  if (t < D) {
    float mm = -INFINITY, ls = 0.0f, os = 0.0f;
    for (int j = 0; j < G; ++j) mm = fmaxf(mm, Mg[j]);
    for (int j = 0; j < G; ++j) {
      const float w = Mg[j] == -INFINITY ? 0.0f : expf(Mg[j] - mm);
      ls += w * Lg[j];
      os += w * Og[j][t];
    }
    Ob[t] = os;
    if (t == 0) Mb[0] = mm, Lb[0] = ls;
  }
  // the cluster's blocks: block r writes columns r, r + C, ...
  ClusterSync(C);
  for (int d = rank + C * t; d < D; d += C * kDecodeThreads) {
    float mm = -INFINITY, ls = 0.0f, os = 0.0f;
    for (int c = 0; c < C; ++c) mm = fmaxf(mm, OfBlock(Mb, c, C)[0]);
    for (int c = 0; c < C; ++c) {
      const float mc = OfBlock(Mb, c, C)[0];
      const float w = mc == -INFINITY ? 0.0f : expf(mc - mm);
      ls += w * OfBlock(Lb, c, C)[0];
      os += w * OfBlock(Ob, c, C)[d];
    }
    o[b * p.o_sb + h * p.o_sh + d] = FromF<T>(Normalised(os, ls));
  }
  if (C > 1) ClusterSync(C);  // no block leaves while another still reads its shared memory
}

// The decode kernel takes a call of one query row per head, D = Dv of 64 or 128, every row 16-byte aligned; launches
// it and returns true, else false (nothing launched).
template <typename T, typename M, bool kAppend = false>
bool LaunchDecode(const SdpaParams& p, const T* q, const T* k, const T* v, const M* m, T* y, cudaStream_t stream,
                  CacheAppend<T> a = {}) {
  if (p.Sq != 1 || p.D != p.Dv || (p.D != 64 && p.D != 128)) return false;
  auto aligned = [](const T* base, int64_t off, int64_t sb, int64_t sh, int64_t ss) {
    constexpr int64_t e = 16 / sizeof(T);
    return reinterpret_cast<uintptr_t>(base + off) % 16 == 0 && sb % e == 0 && sh % e == 0 && ss % e == 0;
  };
  if (!aligned(q, p.q_off, p.q_sb, p.q_sh, 0) || !aligned(k, p.k_off, p.k_sb, p.k_sh, p.k_ss) ||
      !aligned(v, p.v_off, p.v_sb, p.v_sh, p.v_ss)) {
    return false;
  }
  if (kAppend && (!aligned(a.k_new, 0, 0, 0, 0) || !aligned(a.v_new, 0, 0, 0, 0))) return false;
  const int64_t chunk = kDecodeThreads / (p.D / int64_t(16 / sizeof(T))) * kDecodeKeysPerThread;
  const int64_t chunks = (p.Sk + chunk - 1) / chunk, sms = SmCount();
  int C = 1;  // the blocks of a cluster splitting a head's keys: as many as have a chunk, the grid within 2 waves
  if (DeviceAttribute<cudaDevAttrClusterLaunch>(0) > 0) {
    for (int c = 8; c > 1; --c) {
      if (c <= chunks && p.B * p.H * c <= 2 * sms) {
        C = c;
        break;
      }
    }
  }
  KernelLaunch launch(dim3(unsigned(C), unsigned(p.H), unsigned(p.B)), dim3(kDecodeThreads), stream);
  launch.Cluster(unsigned(C)).Pdl();
  CheckCuda(p.D == 64 ? launch(SdpaDecodeKernel<T, M, 64, kAppend>, q, k, v, m, y, p, C, a)
                      : launch(SdpaDecodeKernel<T, M, 128, kAppend>, q, k, v, m, y, p, C, a),
            kDecode, "cudaLaunchKernelEx");
  return true;
}

// The cache write alone (a call the decode kernel does not take): thread d of block (b, g) writes element d of KV
// head g's new key and value at slot pos[b].
template <typename T>
__global__ void CacheAppendKernel(CacheAppend<T> a, SdpaParams p) {
  const int64_t kv_heads = p.H / p.group, b = blockIdx.x / kv_heads, g = blockIdx.x % kv_heads;
  const int64_t at = a.pos[b];
  if (at < 0 || at >= p.Sk) return;
  const T* kn = a.k_new + (b * kv_heads + g) * p.D;
  for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
    a.k_cache[p.k_off + b * p.k_sb + g * p.k_sh + at * p.k_ss + d] =
        a.cos ? Rotated<T>(kn, a.cos + b * p.D, a.sin + b * p.D, d, p.D) : kn[d];
  }
  for (int64_t d = threadIdx.x; d < p.Dv; d += blockDim.x) {
    a.v_cache[p.v_off + b * p.v_sb + g * p.v_sh + at * p.v_ss + d] = a.v_new[(b * kv_heads + g) * p.Dv + d];
  }
}


}  // namespace

bool LaunchDecodeAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k, const void* v,
                           const void* m, void* y, cudaStream_t stream) {
  return WithAttentionTypes(dtype, f32_mask, [&](auto t, auto mask) {
    using T = decltype(t);
    using M = decltype(mask);
    return LaunchDecode<T, M>(p, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                              static_cast<const M*>(m), static_cast<T*>(y), stream);
  });
}

namespace {

// q [B, H, D] rotated into out (a call the decode kernel does not take): thread d of block (b, h)
template <typename T>
__global__ void RotateKernel(const T* q, const float* cos, const float* sin, T* out, SdpaParams p) {
  const int64_t b = blockIdx.x / p.H, h = blockIdx.x % p.H;
  const T* row = q + (b * p.H + h) * p.D;
  for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
    out[(b * p.H + h) * p.D + d] = Rotated<T>(row, cos + b * p.D, sin + b * p.D, d, p.D);
  }
}

template <typename T, typename M>
void LaunchAppend(const SdpaParams& p, int dtype, bool f32_mask, const void* q, void* k, void* v, const void* m,
                  const void* k_new, const void* v_new, const int64_t* pos, const float* cos, const float* sin,
                  void* q_rotated, void* y, cudaStream_t stream) {
  CacheAppend<T> a{static_cast<const T*>(k_new), static_cast<const T*>(v_new), pos, static_cast<T*>(k),
                   static_cast<T*>(v), cos, sin};
  if (LaunchDecode<T, M, true>(p, static_cast<const T*>(q), a.k_cache, a.v_cache, static_cast<const M*>(m),
                               static_cast<T*>(y), stream, a)) {
    return;
  }
  CacheAppendKernel<T><<<unsigned(p.B * (p.H / p.group)), 128, 0, stream>>>(a, p);
  if (cos) {  // the rotated q in the workspace, read as q was ([B, H, D] contiguous)
    RotateKernel<T><<<unsigned(p.B * p.H), 128, 0, stream>>>(static_cast<const T*>(q), cos, sin,
                                                              static_cast<T*>(q_rotated), p);
    q = q_rotated;
  }
  LaunchSplitKeyAttention(p, dtype, f32_mask, q, k, v, m, y, stream);
}

void AppendImpl(const char* op, TensorView q, TensorView k, TensorView v, TensorView bias, TensorView k_new,
                TensorView v_new, TensorView positions, const TensorView* cos, const TensorView* sin, Shape attrs,
                TensorView y, TensorView workspace) {
  int dtype = 0;
  const SdpaParams p = CheckSdpa(op, q, k, v, &bias, attrs, y, workspace, &dtype);
  const int dev = q.device().device_id;
  const int64_t elem = dtype == kF32 ? 4 : 2;
  void* q_rotated = nullptr;
  if (cos) {
    for (const TensorView* t : {cos, sin}) {
      CheckCudaTensor(op, "cos and sin", *t, dev);
      if (TensorDType(*t) != kF32 || t->numel() != p.B * p.D) {
        FailValue(op, "cos and sin must be float32 [B, D] = [" + std::to_string(p.B) + ", " + std::to_string(p.D) +
                          "], got " + DLTypeStr(t->dtype()) + " " + ShapeStr(*t));
      }
    }
    if (p.D % 2 != 0 || (p.D / 2) % (16 / elem) != 0) {
      FailValue(op, "the rotary embedding takes a head dimension whose halves are whole 16-byte loads, got D = " +
                        std::to_string(p.D));
    }
    if (p.q_off != 0 || p.q_sb != p.H * p.D || p.q_sh != p.D) {
      FailValue(op, "q must be read as [B, H, D] contiguous (q_offset 0, strides H * D and D)");
    }
    const Workspace ws = CheckWorkspace(op, workspace, dev);
    if (ws.bytes < size_t(p.B * p.H * p.D * elem)) {
      FailValue(op, "the workspace must hold the rotated q, " + std::to_string(p.B * p.H * p.D * elem) +
                        " bytes after alignment, got " + std::to_string(ws.bytes));
    }
    q_rotated = ws.ptr;
  }
  if (p.Sq != 1) FailValue(op, "takes one query row per head (a decode step), got Sq = " + std::to_string(p.Sq));
  const int64_t kv_heads = p.H / p.group;
  CheckCudaTensor(op, "k_new", k_new, dev);
  CheckCudaTensor(op, "v_new", v_new, dev);
  CheckCudaTensor(op, "positions", positions, dev);
  CheckDType(op, "k_new", k_new, dtype);
  CheckDType(op, "v_new", v_new, dtype);
  if (k_new.numel() != p.B * kv_heads * p.D || v_new.numel() != p.B * kv_heads * p.Dv) {
    FailValue(op, "k_new " + ShapeStr(k_new) + " and v_new " + ShapeStr(v_new) + " must hold B * KV heads * D = " +
                               std::to_string(p.B * kv_heads * p.D) + " elements each (one new position)");
  }
  DLDataType pd = positions.dtype();
  if (!(pd.code == kDLInt && pd.bits == 64 && pd.lanes == 1) || positions.numel() != p.B) {
    FailValue(op, "positions must be " + std::to_string(p.B) + " int64 (one slot per sequence), got " +
                               DLTypeStr(pd) + " " + ShapeStr(positions));
  }
  for (const TensorView* t : {&k_new, &v_new}) {
    if (DataPtr(*t) == DataPtr(k) || DataPtr(*t) == DataPtr(v)) FailValue(op, "k_new and v_new must not alias the caches");
  }
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  const bool f32_mask = dtype != kF32 && TensorDType(bias) == kF32;
  const auto* pos = static_cast<const int64_t*>(DataPtr(positions));
  void *qp = DataPtr(q), *kp = DataPtr(k), *vp = DataPtr(v), *mp = DataPtr(bias), *yp = DataPtr(y);
  void *knp = DataPtr(k_new), *vnp = DataPtr(v_new);
  const float* cp = cos ? static_cast<const float*>(DataPtr(*cos)) : nullptr;
  const float* sp = sin ? static_cast<const float*>(DataPtr(*sin)) : nullptr;
  WithAttentionTypes(dtype, f32_mask, [&](auto t, auto mask) {
    LaunchAppend<decltype(t), decltype(mask)>(p, dtype, f32_mask, qp, kp, vp, mp, knp, vnp, pos, cp, sp, q_rotated, yp,
                                              stream);
  });
  CheckCuda(cudaGetLastError(), op, "attention kernel launch");
}

void AppendBias(TensorView q, TensorView k, TensorView v, TensorView bias, TensorView k_new, TensorView v_new,
                TensorView positions, Shape attrs, TensorView y, TensorView workspace) {
  AppendImpl(kAppendBias, q, k, v, bias, k_new, v_new, positions, nullptr, nullptr, attrs, y, workspace);
}

void AppendRopeBias(TensorView q, TensorView k, TensorView v, TensorView bias, TensorView k_new, TensorView v_new,
                    TensorView positions, TensorView cos, TensorView sin, Shape attrs, TensorView y,
                    TensorView workspace) {
  AppendImpl(kAppendRopeBias, q, k, v, bias, k_new, v_new, positions, &cos, &sin, attrs, y, workspace);
}

__attribute__((constructor)) void RegisterDecodeAttention() {
  try {
    Register(kAppendBias, AppendBias);
    Register(kAppendRopeBias, AppendRopeBias);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
