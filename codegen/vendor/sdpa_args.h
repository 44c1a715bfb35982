// The attrs of the fused-attention calls (nimble.attention.*: our kernel and cuDNN's SDPA) and their
// checks, shared by attention.cu and cudnn_attention.cpp. See attention.cu for the layout.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>

#include "common.h"

namespace nimble_vendor {

// the attrs as the kernels take them (outside the unnamed namespace: attention.cu hands them to the kernels' units)
struct SdpaParams {
  int64_t B, H, Sq, Sk, D, Dv;
  int64_t q_off, q_sb, q_sh, q_ss, k_off, k_sb, k_sh, k_ss, v_off, v_sb, v_sh, v_ss;
  int64_t o_sb, o_sh, o_ss, m_sb, m_sh, m_sq, m_sk;
  float scale;
  int64_t group;  // query heads per KV head (grouped-query attention): head h reads k and v's head h / group
};
static_assert(offsetof(SdpaParams, m_sk) == 24 * sizeof(int64_t), "the attrs fill B .. m_sk in order");

// The mask m (kF32, or 16-bit of mask_dtype) as read through p's strides m_sb, m_sh, m_sq, m_sk, written to out as a
// contiguous [Bm, Hm, Sq, Sk] tensor of out_dtype (kF16 / kBF16; Bm = B where m_sb != 0, else 1, Hm likewise) on
// `stream`, each value clamped to out_dtype's finite range (finfo(float32).min and -inf become its lowest value; NaN
// stays NaN): the bias cuDNN's SDPA reads (small_kernels.cu; cudnn_attention.cpp launches it)
void LaunchSdpaBiasToHalf(const char* op, const SdpaParams& p, int mask_dtype, const void* m, int out_dtype, void* out,
                          cudaStream_t stream);

namespace {

// 26 attrs, or 27 with the KV group (grouped-query attention) last: plans made before the group was added keep
// working, and the offload writes the group only where it is over 1
constexpr int kNumAttrs = 27;
constexpr int64_t kMaxHeadDim = 128;

// softmax's normalisation of a row's weighted sum: 0 for a row whose every score is -inf (a fully masked query, e.g. a
// left-padded position in a 16-bit model whose mask is -inf), which has nothing to weigh (0 / 0 would be NaN)
#ifdef __CUDACC__
__device__ __forceinline__ float Normalised(float x, float l) { return l > 0.0f ? x / l : 0.0f; }
#endif

// The largest element a strided [B, H, S, D] view reads, +1 (what the tensor must hold).
int64_t ViewExtent(int64_t off, int64_t sb, int64_t sh, int64_t ss, int64_t B, int64_t H, int64_t S, int64_t D) {
  return off + (B - 1) * sb + (H - 1) * sh + (S - 1) * ss + D;
}

void CheckView(const char* op, const char* name, const TensorView& t, int64_t off, int64_t sb, int64_t sh, int64_t ss,
               int64_t B, int64_t H, int64_t S, int64_t D) {
  if (off < 0 || sb < 0 || sh < 0 || ss < 0) FailValue(op, std::string(name) + ": offsets and strides must be >= 0");
  int64_t need = ViewExtent(off, sb, sh, ss, B, H, S, D);
  if (need > t.numel()) {
    FailValue(op, std::string(name) + " " + ShapeStr(t) + " holds " + std::to_string(t.numel()) +
                      " elements but the attrs' view of it reads up to element " + std::to_string(need - 1));
  }
}

// The attrs as SdpaParams, after checking every tensor against them (one-line errors); *dtype: kF32 / kF16 / kBF16.
SdpaParams CheckSdpa(const char* op, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* bias,
                     const Shape& attrs, const TensorView& y, const TensorView& workspace, int* dtype_out) {
  if (int(attrs.size()) != kNumAttrs && int(attrs.size()) != kNumAttrs - 1) {
    FailValue(op, "attrs must have " + std::to_string(kNumAttrs - 1) + " or " + std::to_string(kNumAttrs) +
                      " entries (see the extension's header), got " + std::to_string(attrs.size()));
  }
  if (q.device().device_type != kDLCUDA) {
    FailValue(op, "q must be a CUDA tensor, got device type " + std::to_string(q.device().device_type));
  }
  const int dev = q.device().device_id;
  const int dtype = *dtype_out = TensorDType(q);
  if (dtype < 0) FailValue(op, "q has dtype " + DLTypeStr(q.dtype()) + ": " + kDTypesTaken);
  CheckCudaTensor(op, "q", q, dev);
  CheckCudaTensor(op, "k", k, dev);
  CheckCudaTensor(op, "v", v, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckDType(op, "k", k, dtype);
  CheckDType(op, "v", v, dtype);
  CheckDType(op, "y", y, dtype);
  if (bias) {
    CheckCudaTensor(op, "bias", *bias, dev);
    // a mask in fp32 beside 16-bit q/k/v: the mixed-precision policy adds it in fp32 (a padding mask of
    // finfo(float32).min would be -inf in 16 bits)
    if (TensorDType(*bias) != kF32) CheckDType(op, "bias", *bias, dtype);
  }
  CheckWorkspace(op, workspace, dev);
  SdpaParams p;
  int64_t* f = &p.B;  // B .. m_sk: the first 25 attrs, in order; then the scale's bits and the KV group
  for (int i = 0; i < kNumAttrs - 1; ++i) f[i] = attrs[i];
  uint32_t bits = uint32_t(attrs[kNumAttrs - 2]);
  std::memcpy(&p.scale, &bits, sizeof(bits));
  p.group = int(attrs.size()) == kNumAttrs ? attrs[kNumAttrs - 1] : 1;
  if (p.B < 1 || p.H < 1 || p.Sq < 1 || p.Sk < 1 || p.D < 1 || p.Dv < 1) {
    FailValue(op, "attrs " + ShapeStr(attrs.data(), 6) + ": B, H, Sq, Sk, D and Dv must be >= 1");
  }
  if (p.D > kMaxHeadDim || p.Dv > kMaxHeadDim) {
    FailValue(op, "head dimensions D = " + std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) + " exceed " +
                      std::to_string(kMaxHeadDim));
  }
  if (p.B > 65535 || p.H > 65535) FailValue(op, "B and H must be <= 65535");
  if (!std::isfinite(p.scale)) FailValue(op, "the scale (attrs' entry 25, float32 bits) is not finite");
  if (p.group < 1 || p.H % p.group != 0) {
    FailValue(op, "the KV group (attrs' entry 26) must be >= 1 and divide H = " + std::to_string(p.H) + ", got " +
                      std::to_string(p.group));
  }
  const int64_t kv_heads = p.H / p.group;
  CheckView(op, "q", q, p.q_off, p.q_sb, p.q_sh, p.q_ss, p.B, p.H, p.Sq, p.D);
  CheckView(op, "k", k, p.k_off, p.k_sb, p.k_sh, p.k_ss, p.B, kv_heads, p.Sk, p.D);
  CheckView(op, "v", v, p.v_off, p.v_sb, p.v_sh, p.v_ss, p.B, kv_heads, p.Sk, p.Dv);
  CheckView(op, "y", y, 0, p.o_sb, p.o_sh, p.o_ss, p.B, p.H, p.Sq, p.Dv);
  if (y.numel() != p.B * p.H * p.Sq * p.Dv) {
    FailValue(op, "y " + ShapeStr(y) + " must hold B * H * Sq * Dv = " + std::to_string(p.B * p.H * p.Sq * p.Dv) +
                      " elements");
  }
  if (bias) {
    if (p.m_sb < 0 || p.m_sh < 0 || p.m_sq < 0 || p.m_sk < 0) FailValue(op, "bias strides must be >= 0");
    int64_t need = (p.B - 1) * p.m_sb + (p.H - 1) * p.m_sh + (p.Sq - 1) * p.m_sq + (p.Sk - 1) * p.m_sk + 1;
    if (need > bias->numel()) {
      FailValue(op, "bias " + ShapeStr(*bias) + " holds " + std::to_string(bias->numel()) +
                        " elements but the attrs' strides read up to element " + std::to_string(need - 1));
    }
  }
  for (const TensorView* t : {&q, &k, &v}) {
    if (DataPtr(*t) == DataPtr(y)) FailValue(op, "y must not alias q, k or v");
  }
  return p;
}

}  // namespace
}  // namespace nimble_vendor
