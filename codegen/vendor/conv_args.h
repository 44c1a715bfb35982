// What the two convolution paths share (nimble_vendor.cpp: cuDNN's legacy API; cudnn_conv_graph.cpp: the cuDNN
// frontend's graph API): the attrs, the argument checks, and the bias/activation epilogue kernel.
#pragma once

#include <cudnn.h>

#include <array>
#include <string>

#include "common.h"

namespace nimble_vendor {

// y = act(y_in + bias[c] (+ z)), c = (i / inner) % channels, on `stream` (small_kernels.cu): the epilogue where
// cuDNN/cuBLASLt cannot fuse it (relu6, the exact GELU, identity outside IMPLICIT_PRECOMP_GEMM, a GEMM candidate
// without cuBLASLt's bias epilogue). bias and z may be null.
void LaunchBiasAct(const char* op, int dtype, void* y, const void* bias, const void* z, int64_t n, int64_t inner,
                   int64_t channels, int act, cudaStream_t stream);

namespace {

// layout 0: x and y NCHW, w OIHW; 1: x and y NHWC, w OHWI (a channels-last build; an 11th attrs entry, 0 if absent)
struct ConvAttrs {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, act, algo, tf32, layout;
};

ConvAttrs ParseConvAttrs(const char* op, const Shape& attrs) {
  if (attrs.size() != 10 && attrs.size() != 11) {
    FailValue(op, "attrs must have 10 or 11 entries [stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, "
                  "activation, algo, allow_tf32(, layout)], got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  ConvAttrs a{attrs[0], attrs[1], attrs[2], attrs[3], attrs[4], attrs[5], attrs[6], attrs[7], attrs[8], attrs[9],
              attrs.size() == 11 ? attrs[10] : 0};
  std::string s = ShapeStr(attrs.data(), int(attrs.size()));
  if (a.stride_h < 1 || a.stride_w < 1 || a.dil_h < 1 || a.dil_w < 1 || a.pad_h < 0 || a.pad_w < 0 || a.groups < 1) {
    FailValue(op, "attrs " + s + ": strides, dilations and groups must be >= 1 and pads >= 0");
  }
  if (a.act < 0 || a.act > 2) FailValue(op, "attrs " + s + ": activation must be 0 (identity), 1 (relu) or 2 (relu6)");
  if (a.algo < -1 || a.algo >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT) {
    FailValue(op, "attrs " + s + ": algo must be -1 (choose) or a cudnnConvolutionFwdAlgo_t in 0.." +
                      std::to_string(CUDNN_CONVOLUTION_FWD_ALGO_COUNT - 1));
  }
  if (a.tf32 != 0 && a.tf32 != 1) FailValue(op, "attrs " + s + ": allow_tf32 must be 0 or 1");
  if (a.layout != 0 && a.layout != 1) FailValue(op, "attrs " + s + ": layout must be 0 (NCHW / OIHW) or 1 (NHWC / OHWI)");
  return a;
}

// Output spatial size; checks the configuration is consistent. x [N,C,H,W], w [O,C/g,KH,KW].
std::array<int64_t, 4> ConvOutShape(const char* op, const int64_t* x, const int64_t* w, const ConvAttrs& a) {
  if (x[1] % a.groups != 0 || w[0] % a.groups != 0) {
    FailValue(op, "groups=" + std::to_string(a.groups) + " must divide the input channels " + std::to_string(x[1]) +
                      " and the output channels " + std::to_string(w[0]));
  }
  if (w[1] != x[1] / a.groups) {
    FailValue(op, "w " + ShapeStr(w, 4) + " needs C/groups = " + std::to_string(x[1] / a.groups) +
                      " input channels for x " + ShapeStr(x, 4) + " and groups=" + std::to_string(a.groups));
  }
  int64_t ekh = a.dil_h * (w[2] - 1) + 1, ekw = a.dil_w * (w[3] - 1) + 1;
  int64_t oh = (x[2] + 2 * a.pad_h - ekh) / a.stride_h + 1;
  int64_t ow = (x[3] + 2 * a.pad_w - ekw) / a.stride_w + 1;
  if (x[2] + 2 * a.pad_h < ekh || x[3] + 2 * a.pad_w < ekw || oh < 1 || ow < 1) {
    FailValue(op, "the kernel " + ShapeStr(w, 4) + " with the given pads/dilations does not fit x " + ShapeStr(x, 4));
  }
  for (int i = 0; i < 4; ++i) {
    if (x[i] > INT32_MAX || w[i] > INT32_MAX) FailValue(op, "dimensions must fit in int32 for cuDNN");
  }
  return {x[0], w[0], oh, ow};
}

// [N,C,H,W] (or [O,C,KH,KW]) of a tensor in `layout` (0: itself; 1: NHWC / OHWI)
std::array<int64_t, 4> Logical(const int64_t* shape, int64_t layout) {
  if (layout == 1) return {shape[0], shape[3], shape[1], shape[2]};
  return {shape[0], shape[1], shape[2], shape[3]};
}

// One convolution call, checked: x [N,C,H,W], w [O,C/g,KH,KW], b [O], z (or null) and y [N,O,P,Q] (or NHWC x, z
// and y and an OHWI w), all of one dtype on one CUDA device. The shapes here are in NCHW / OIHW order whatever
// the layout.
struct ConvCall {
  ConvAttrs a;
  int dev = 0, dtype = 0;
  std::array<int64_t, 4> xs{}, wsh{}, ys{};
  Workspace ws;
  bool empty = false;  // y has no elements: nothing to do
};

ConvCall CheckConv(const char* op, const TensorView& x, const TensorView& w, const TensorView& b, const TensorView* z,
                   const Shape& attrs, const TensorView& y, const TensorView& workspace) {
  ConvCall c;
  c.a = ParseConvAttrs(op, attrs);
  if (x.device().device_type != kDLCUDA) {
    FailValue(op, "x must be a CUDA tensor, got device type " + std::to_string(x.device().device_type));
  }
  c.dev = x.device().device_id;
  c.dtype = TensorDType(x);
  if (c.dtype < 0) FailValue(op, "x has dtype " + DLTypeStr(x.dtype()) + ": " + kDTypesTaken);
  CheckCudaTensor(op, "x", x, c.dev);
  CheckCudaTensor(op, "w", w, c.dev);
  CheckCudaTensor(op, "b", b, c.dev);
  CheckCudaTensor(op, "y", y, c.dev);
  if (z) CheckCudaTensor(op, "z", *z, c.dev);
  CheckDType(op, "w", w, c.dtype);
  CheckDType(op, "b", b, c.dtype);
  CheckDType(op, "y", y, c.dtype);
  if (z) CheckDType(op, "z", *z, c.dtype);
  CheckNdim(op, "x", x, 4);
  CheckNdim(op, "w", w, 4);
  CheckNdim(op, "b", b, 1);
  CheckNdim(op, "y", y, 4);
  c.ws = CheckWorkspace(op, workspace, c.dev);
  c.xs = Logical(x.shape().data(), c.a.layout);
  c.wsh = Logical(w.shape().data(), c.a.layout);
  c.ys = ConvOutShape(op, c.xs.data(), c.wsh.data(), c.a);
  const std::array<int64_t, 4> y_phys =
      c.a.layout == 1 ? std::array<int64_t, 4>{c.ys[0], c.ys[2], c.ys[3], c.ys[1]} : c.ys;
  if (b.shape()[0] != c.wsh[0]) {
    FailValue(op, "b has shape " + ShapeStr(b) + " but w " + ShapeStr(w) + " has " + std::to_string(c.wsh[0]) +
                      " output channels");
  }
  for (int i = 0; i < 4; ++i) {
    if (y.shape()[i] != y_phys[i]) {
      FailValue(op, "y has shape " + ShapeStr(y) + " but x " + ShapeStr(x) + ", w " + ShapeStr(w) + " and attrs " +
                        ShapeStr(attrs.data(), int(attrs.size())) + " give " + ShapeStr(y_phys.data(), 4));
    }
    if (z && z->shape()[i] != y_phys[i]) {
      FailValue(op, "z has shape " + ShapeStr(*z) + " but y has shape " + ShapeStr(y_phys.data(), 4));
    }
  }
  if (DataPtr(y) == DataPtr(x)) FailValue(op, "y must not alias x");
  c.empty = c.ys[0] * c.ys[1] * c.ys[2] * c.ys[3] == 0;
  return c;
}

// y = act(y + b (+ z)) over a checked call's output, in its layout (channels are NHWC's fastest axis)
void LaunchConvBiasAct(const char* op, const ConvCall& c, void* y, const void* b, const void* z, cudaStream_t stream) {
  const auto& ys = c.ys;
  LaunchBiasAct(op, c.dtype, y, b, z, ys[0] * ys[1] * ys[2] * ys[3], c.a.layout == 1 ? 1 : ys[2] * ys[3], ys[1],
                int(c.a.act), stream);
}

}  // namespace
}  // namespace nimble_vendor
