// Depthwise convolutions and 2-D pools as one stencil kernel, for small batches:
//
//   nimble.depthwise.conv2d(x, w, b, attrs, y, workspace)         y = act(dwconv(x', w) + b)
//   nimble.depthwise.conv2d_add(x, w, b, z, attrs, y, workspace)  y = act(dwconv(x', w) + b + z)
//   nimble.depthwise.pool2d(x, attrs, y, workspace)               y = act(pool(x'))
//   nimble.depthwise.pool2d_add(x, z, attrs, y, workspace)        y = act(pool(x') + z)
//
//   x' = relu(x) when attrs say so (the ReLU a separable convolution starts with, folded in);
//   x, z, y NHWC (layout 1) or NCHW (layout 0); w [KH, KW, C] (a channel's taps are C apart: the NHWC kernel
//   reads a vector of channels per tap); b [C];
//   attrs = [kh, kw, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, act, relu_input, layout, mode],
//   mode 0: depthwise convolution (channel multiplier 1), 1: average over the taps inside the input,
//   2: average over all kh * kw taps (count_include_pad), 3: max (padding never wins).
//   The output size is y's: the bottom and right pads are whatever it implies, so asymmetric ("SAME")
//   padding needs no second form. act: 0 identity, 1 relu, 2 relu6.
//
// Why: cuDNN runs a depthwise convolution at batch 1 as a grouped convolution, several microseconds each even in
// NHWC half precision, and nasnetalarge has 270 of them plus 40 pools (cuDNN only takes an average pool as a
// depthwise convolution with a separate divisor multiply). Every tap here is a vector load of up to 16 bytes of
// channels from L1/L2, computed in fp32 and rounded once; a thread computes one output pixel's vector. fp32,
// fp16 and bf16. The workspace is unused (the vendor calling convention).
#include <string>

#include "common.h"
#include "depthwise_kernels.h"

namespace nimble_vendor {
namespace {

constexpr const char* kConv = "nimble.depthwise.conv2d";
constexpr const char* kConvAdd = "nimble.depthwise.conv2d_add";
constexpr const char* kPool = "nimble.depthwise.pool2d";
constexpr const char* kPoolAdd = "nimble.depthwise.pool2d_add";

// Checks the call and runs it. w, b, z may be null (a pool; no residual).
void Stencil(const char* op, const TensorView& x, const TensorView* w, const TensorView* b, const TensorView* z,
             const Shape& attrs, const TensorView& y, const TensorView& workspace) {
  if (attrs.size() != 12) {
    FailValue(op, "attrs must be [kh, kw, stride_h, stride_w, pad_top, pad_left, dil_h, dil_w, activation, "
                  "relu_input, layout, mode], got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  const std::string a = ShapeStr(attrs.data(), int(attrs.size()));
  for (int i = 0; i < 12; ++i) {
    if (attrs[i] < 0 || attrs[i] > INT32_MAX) FailValue(op, "attrs " + a + " must be non-negative int32 values");
  }
  const int64_t mode = attrs[11], layout = attrs[10];
  if (attrs[0] < 1 || attrs[1] < 1 || attrs[2] < 1 || attrs[3] < 1 || attrs[6] < 1 || attrs[7] < 1) {
    FailValue(op, "attrs " + a + ": the window, strides and dilations must be >= 1");
  }
  if (attrs[8] > 2) FailValue(op, "attrs " + a + ": activation must be 0 (identity), 1 (relu) or 2 (relu6)");
  if (attrs[9] > 1 || layout > 1) FailValue(op, "attrs " + a + ": relu_input and layout must be 0 or 1");
  if ((w != nullptr) != (mode == kDwConv) || mode > kMax) {
    FailValue(op, "attrs " + a + ": mode must be " + (w ? "0 (a depthwise convolution)" : "1, 2 or 3 (a pool)"));
  }
  if (x.device().device_type != kDLCUDA) FailValue(op, "x must be a CUDA tensor");
  const int dev = x.device().device_id;
  const int dtype = TensorDType(x);
  if (dtype < 0) FailValue(op, "x has dtype " + DLTypeStr(x.dtype()) + ": " + kDTypesTaken);
  CheckCudaTensor(op, "x", x, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckDType(op, "y", y, dtype);
  CheckNdim(op, "x", x, 4);
  CheckNdim(op, "y", y, 4);
  CheckWorkspace(op, workspace, dev);
  const int64_t* xs = x.shape().data();
  const int64_t* ys = y.shape().data();
  // logical [N, C, H, W] of x and y
  const int64_t n = xs[0], c = layout ? xs[3] : xs[1], h = layout ? xs[1] : xs[2], wd = layout ? xs[2] : xs[3];
  const int64_t oc = layout ? ys[3] : ys[1], oh = layout ? ys[1] : ys[2], ow = layout ? ys[2] : ys[3];
  if (ys[0] != n || oc != c) FailValue(op, "y " + ShapeStr(y) + " must have x " + ShapeStr(x) + "'s batch and channels");
  for (int i = 0; i < 4; ++i) {
    if (xs[i] > INT32_MAX || ys[i] > INT32_MAX) FailValue(op, "dimensions must fit in int32");
  }
  const int64_t ekh = attrs[6] * (attrs[0] - 1) + 1, ekw = attrs[7] * (attrs[1] - 1) + 1;
  // the last window must start inside the top/left-padded input, and the first one must reach it
  if (oh < 1 || ow < 1 || (oh - 1) * attrs[2] - attrs[4] >= h || (ow - 1) * attrs[3] - attrs[5] >= wd ||
      attrs[4] >= ekh || attrs[5] >= ekw) {
    FailValue(op, "y " + ShapeStr(y) + " does not follow from x " + ShapeStr(x) + " and attrs " + a);
  }
  if (w) {
    CheckCudaTensor(op, "w", *w, dev);
    CheckDType(op, "w", *w, dtype);
    CheckNdim(op, "w", *w, 3);
    if (w->shape()[0] != attrs[0] || w->shape()[1] != attrs[1] || w->shape()[2] != c) {
      FailValue(op, "w " + ShapeStr(*w) + " must be [kh, kw, C] = [" + std::to_string(attrs[0]) + ", " +
                        std::to_string(attrs[1]) + ", " + std::to_string(c) + "]");
    }
  }
  if (b) {
    CheckCudaTensor(op, "b", *b, dev);
    CheckDType(op, "b", *b, dtype);
    CheckNdim(op, "b", *b, 1);
    if (b->shape()[0] != c) FailValue(op, "b " + ShapeStr(*b) + " must have the " + std::to_string(c) + " channels");
  }
  if (z) {
    CheckCudaTensor(op, "z", *z, dev);
    CheckDType(op, "z", *z, dtype);
    CheckNdim(op, "z", *z, 4);
    for (int i = 0; i < 4; ++i) {
      if (z->shape()[i] != ys[i]) FailValue(op, "z " + ShapeStr(*z) + " must have y's shape " + ShapeStr(y));
    }
  }
  if (DataPtr(y) == DataPtr(x)) FailValue(op, "y must not alias x");
  if (n * c * oh * ow == 0) return;
  StencilParams p{int(n), int(h), int(wd), int(c), int(oh), int(ow), int(attrs[0]), int(attrs[1]), int(attrs[2]),
                  int(attrs[3]), int(attrs[4]), int(attrs[5]), int(attrs[6]), int(attrs[7]), int(attrs[8]),
                  int(attrs[9])};
  DeviceGuard guard(dev, op);
  cudaStream_t s = CurrentStream(dev);
  const void* wp = w ? DataPtr(*w) : nullptr;
  const void* bp = b ? DataPtr(*b) : nullptr;
  const void* zp = z ? DataPtr(*z) : nullptr;
  if (dtype == kF32) LaunchStencilF32(int(mode), int(layout), DataPtr(x), wp, bp, zp, DataPtr(y), p, s);
  else if (dtype == kF16) LaunchStencilF16(int(mode), int(layout), DataPtr(x), wp, bp, zp, DataPtr(y), p, s);
  else LaunchStencilBF16(int(mode), int(layout), DataPtr(x), wp, bp, zp, DataPtr(y), p, s);
  CheckCuda(cudaGetLastError(), op, "stencil kernel launch");
}

void Conv(TensorView x, TensorView w, TensorView b, Shape attrs, TensorView y, TensorView workspace) {
  Stencil(kConv, x, &w, &b, nullptr, attrs, y, workspace);
}

void ConvAdd(TensorView x, TensorView w, TensorView b, TensorView z, Shape attrs, TensorView y, TensorView workspace) {
  Stencil(kConvAdd, x, &w, &b, &z, attrs, y, workspace);
}

void Pool(TensorView x, Shape attrs, TensorView y, TensorView workspace) {
  Stencil(kPool, x, nullptr, nullptr, nullptr, attrs, y, workspace);
}

void PoolAdd(TensorView x, TensorView z, Shape attrs, TensorView y, TensorView workspace) {
  Stencil(kPoolAdd, x, nullptr, nullptr, &z, attrs, y, workspace);
}

__attribute__((constructor)) void RegisterDepthwise() {
  try {
    Register(kConv, Conv);
    Register(kConvAdd, ConvAdd);
    Register(kPool, Pool);
    Register(kPoolAdd, PoolAdd);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
