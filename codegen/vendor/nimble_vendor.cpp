// tvm-nimble vendor-kernel extension: cuDNN convolutions and cuBLASLt GEMMs as TVM FFI global
// functions in destination-passing style, so that a Nimble plan launches them like any other
// kernel (R.call_dps_packed("nimble.cudnn.conv2d", ...)), on several streams, inside CUDA graph
// capture.
//
// Functions (registered when this library is loaded; see tvm_nimble/runtime/vendor.py):
//   nimble.cudnn.conv2d(x, w, b, attrs, y, workspace)
//   nimble.cudnn.conv2d_add(x, w, b, z, attrs, y, workspace)
//       y = act(conv2d(x, w) + b [+ z]); NCHW / OIHW or NHWC / OHWI; fp32, fp16 or bf16; b [O]; z shaped like y.
//       attrs = [stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, activation, algo, allow_tf32(, layout)]
//       layout: 0 (NCHW / OIHW, also when left out) or 1 (NHWC / OHWI: a channels-last build's)
//       activation: 0 identity, 1 relu, 2 relu6; algo: -1 choose (heuristics, cached), >= 0 forced
//       cudnnConvolutionFwdAlgo_t. Padding is symmetric per axis (pad_h top and bottom, pad_w left
//       and right): that is what cuDNN's convolution descriptor can express.
//   nimble.cublas.matmul(a, b, bias, attrs, y, workspace)
//       y = act(a @ op(b) + bias); a [..., M, K] (rows flattened), b [N, K] if transpose_b else
//       [K, N], bias [N] or [0] (no bias), y of M * N elements, its last dimension N (any leading
//       dimensions: a reshape of the rows is free); attrs = [transpose_b, activation, allow_tf32(, algo)];
//       activation: 0 identity, 1 relu, 2 relu6, 3 gelu (erf), 4 gelu (tanh approximation: cuBLASLt's
//       GELU epilogue); algo: an index into the candidates (cuBLASLt's heuristic list with the bias
//       epilogue, then without it; without a bias only the latter; 0, the first, if left out). y (and
//       bias, and matmul_add's z) may be float32 where a and b are 16-bit: the sum is rounded once, to
//       y's dtype (a float32 residual stream).
//   nimble.cublas.matmul_add(a, b, bias, z, attrs, y, workspace)
//       y = act(a @ op(b) + bias + z), z shaped like y (a residual: cuBLASLt's C with beta = 1); attrs
//       as matmul's.
//   nimble.cublas.batched_matmul(a, b, attrs, y, workspace)
//       y[i] = a[i] @ op(b[i]) over the leading (batch) dimensions, one strided-batched cuBLASLt call;
//       a [..., M, K], b [..., N, K] if transpose_b else [..., K, N], y [..., M, N], the same leading
//       dimensions everywhere (no broadcasting); attrs = [transpose_b, allow_tf32(, algo)].
//   nimble.cublas.matmul_timings(a, b, bias, attrs, y, workspace, reps) -> [us, ...]
//   nimble.cublas.matmul_add_timings(a, b, bias, z, attrs, y, workspace, reps) -> [us, ...]
//   nimble.cublas.batched_matmul_timings(a, b, attrs, y, workspace, reps) -> [us, ...]
//       microseconds per call of each algorithm index, for the build's choice (synchronizes; y is
//       overwritten; not inside a graph capture)
//   nimble.vendor.versions() -> str                 runtime library versions (no GPU needed)
//   nimble.cudnn.conv2d_algos(x_shape, w_shape, attrs, dtype, device_id) -> [[algo, status,
//       workspace_bytes, math_type, determinism], ...] in cuDNN's heuristic order (needs a GPU)
//   nimble.vendor.plans() -> [str]                   one line per cached configuration
//
// The workspace is always the last argument: a 1-D uint8 tensor owned by the caller's memory plan;
// its length is the budget (1 byte = none). Everything that costs host time (descriptors, the
// algorithm choice, handles) is created on the first call of a configuration / stream, which the
// executor makes in its live run before capture; later calls only look up and enqueue. Nothing
// here allocates device memory or synchronizes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cudnn.h>

#include <tvm/ffi/any.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "handles.h"
#include "conv_args.h"

namespace nimble_vendor {
namespace {

constexpr const char* kConv = "nimble.cudnn.conv2d";
constexpr const char* kConvAdd = "nimble.cudnn.conv2d_add";
constexpr const char* kConvBwdData = "nimble.cudnn.conv2d_bwd_data";
constexpr const char* kConvBwdFilter = "nimble.cudnn.conv2d_bwd_filter";
constexpr const char* kMatmul = "nimble.cublas.matmul";
constexpr const char* kBatchedMatmul = "nimble.cublas.batched_matmul";
constexpr const char* kMatmulAdd = "nimble.cublas.matmul_add";
// the same two calls under provider tf32x3's names: a float32 GEMM as three TF32 products, its operands split by the
// passes (relay_passes/providers/tf32x3.py) and allow_tf32 set in its attrs; apart so that plans and reports tell
// it from cuBLASLt's own float32 Linear
constexpr const char* kTf32x3Matmul = "nimble.cublas.tf32x3_matmul";
constexpr const char* kTf32x3MatmulAdd = "nimble.cublas.tf32x3_matmul_add";

// ---------------------------------------------------------------------------------------------
// cuDNN convolution

const char* MathName(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor_op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor_op_allow_conversion";
    case CUDNN_FMA_MATH: return "fma";
  }
  return "?";
}

// Descriptors for one configuration; set up once, read-only afterwards.
struct ConvDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnActivationDescriptor_t act = nullptr;
  ~ConvDescs() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (act) cudnnDestroyActivationDescriptor(act);
  }
};

// x, w and y in NCHW / OIHW order; a.layout says how they lie in memory (1: NHWC / OHWI, cuDNN's KRSC filter)
void MakeConvDescs(const char* op, ConvDescs* d, int dtype, const int64_t* x, const int64_t* w,
                   const std::array<int64_t, 4>& y, const ConvAttrs& a) {
  cudnnDataType_t dt = dtype == kF32 ? CUDNN_DATA_FLOAT : dtype == kF16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  const cudnnTensorFormat_t format = a.layout == 1 ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  CheckCudnn(cudnnCreateTensorDescriptor(&d->x), op, "cudnnCreateTensorDescriptor");
  CheckCudnn(cudnnCreateTensorDescriptor(&d->y), op, "cudnnCreateTensorDescriptor");
  CheckCudnn(cudnnCreateTensorDescriptor(&d->bias), op, "cudnnCreateTensorDescriptor");
  CheckCudnn(cudnnCreateFilterDescriptor(&d->w), op, "cudnnCreateFilterDescriptor");
  CheckCudnn(cudnnCreateConvolutionDescriptor(&d->conv), op, "cudnnCreateConvolutionDescriptor");
  CheckCudnn(cudnnCreateActivationDescriptor(&d->act), op, "cudnnCreateActivationDescriptor");
  CheckCudnn(cudnnSetTensor4dDescriptor(d->x, format, dt, int(x[0]), int(x[1]), int(x[2]), int(x[3])),
             op, "cudnnSetTensor4dDescriptor(x)", "x " + ShapeStr(x, 4));
  CheckCudnn(cudnnSetTensor4dDescriptor(d->y, format, dt, int(y[0]), int(y[1]), int(y[2]), int(y[3])),
             op, "cudnnSetTensor4dDescriptor(y)", "y " + ShapeStr(y.data(), 4));
  CheckCudnn(cudnnSetTensor4dDescriptor(d->bias, CUDNN_TENSOR_NCHW, dt, 1, int(y[1]), 1, 1), op,
             "cudnnSetTensor4dDescriptor(bias)");
  CheckCudnn(cudnnSetFilter4dDescriptor(d->w, dt, format, int(w[0]), int(w[1]), int(w[2]), int(w[3])),
             op, "cudnnSetFilter4dDescriptor", "w " + ShapeStr(w, 4));
  // fp32 accumulation for every dtype ("pseudo half" / "pseudo bfloat16": tensor cores accumulating in fp32)
  CheckCudnn(cudnnSetConvolution2dDescriptor(d->conv, int(a.pad_h), int(a.pad_w), int(a.stride_h), int(a.stride_w),
                                             int(a.dil_h), int(a.dil_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
             op, "cudnnSetConvolution2dDescriptor");
  CheckCudnn(cudnnSetConvolutionGroupCount(d->conv, int(a.groups)), op, "cudnnSetConvolutionGroupCount");
  CheckCudnn(cudnnSetActivationDescriptor(d->act, a.act == 1 ? CUDNN_ACTIVATION_RELU : CUDNN_ACTIVATION_IDENTITY,
                                          CUDNN_PROPAGATE_NAN, 0.0),
             op, "cudnnSetActivationDescriptor");
  int n, c, h, ww;
  CheckCudnn(cudnnGetConvolution2dForwardOutputDim(d->conv, d->x, d->w, &n, &c, &h, &ww), op,
             "cudnnGetConvolution2dForwardOutputDim");
  if (n != y[0] || c != y[1] || h != y[2] || ww != y[3]) {
    FailValue(op, "cuDNN computes output [" + std::to_string(n) + ", " + std::to_string(c) + ", " + std::to_string(h) +
                      ", " + std::to_string(ww) + "] but the expected output is " + ShapeStr(y.data(), 4));
  }
}

// The math type before the choice: fp32 without TF32 is restricted to FMA kernels.
cudnnMathType_t BaseMath(int dtype, bool tf32) {
  if (dtype != kF32) return CUDNN_TENSOR_OP_MATH;
  return tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

bool MathAllowed(int dtype, bool tf32, cudnnMathType_t m) {
  if (dtype == kF32 && !tf32) return m != CUDNN_TENSOR_OP_MATH && m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return true;
}

struct ConvPlan {
  ConvDescs d;
  cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t ws_need = 0;
  bool fused = false;           // cudnnConvolutionBiasActivationForward
  bool fused_checked = false;   // a fused call has succeeded once (else NOT_SUPPORTED falls back)
  std::string desc;
  std::mutex mu;
};

using ConvKey = std::array<int64_t, 23>;

std::mutex& ConvMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::map<ConvKey, std::unique_ptr<ConvPlan>>& ConvPlans() {
  static auto* m = new std::map<ConvKey, std::unique_ptr<ConvPlan>>();
  return *m;
}

std::vector<cudnnConvolutionFwdAlgoPerf_t> Heuristics(const char* op, cudnnHandle_t h, const ConvDescs& d) {
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  int n = 0;
  CheckCudnn(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n,
                                                    perf.data()),
             op, "cudnnGetConvolutionForwardAlgorithm_v7");
  perf.resize(std::max(n, 0));
  return perf;
}

void ChooseAlgo(const char* op, cudnnHandle_t h, ConvPlan* p, int dtype, const ConvAttrs& a, size_t ws_bytes,
                bool has_z) {
  bool tf32 = a.tf32 != 0;
  cudnnMathType_t base = BaseMath(dtype, tf32);
  CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, base), op, "cudnnSetConvolutionMathType");
  if (a.algo >= 0) {
    p->algo = static_cast<cudnnConvolutionFwdAlgo_t>(a.algo);
    p->math = base;
    CheckCudnn(cudnnGetConvolutionForwardWorkspaceSize(h, p->d.x, p->d.w, p->d.conv, p->d.y, p->algo, &p->ws_need),
               op, "cudnnGetConvolutionForwardWorkspaceSize", "forced algo " + std::to_string(a.algo));
    if (p->ws_need > ws_bytes) {
      FailValue(op, "forced algo " + std::to_string(a.algo) + " needs " + std::to_string(p->ws_need) +
                        " workspace bytes but the workspace holds " + std::to_string(ws_bytes) +
                        " (after 256-byte alignment)");
    }
  } else {
    bool found = false;
    size_t smallest = SIZE_MAX;
    for (const auto& perf : Heuristics(op, h, p->d)) {
      if (perf.status != CUDNN_STATUS_SUCCESS || !MathAllowed(dtype, tf32, perf.mathType)) continue;
      cudnnMathType_t m = (dtype == kF32 && !tf32) ? CUDNN_FMA_MATH : perf.mathType;
      CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, m), op, "cudnnSetConvolutionMathType");
      size_t need = 0;
      if (cudnnGetConvolutionForwardWorkspaceSize(h, p->d.x, p->d.w, p->d.conv, p->d.y, perf.algo, &need) !=
          CUDNN_STATUS_SUCCESS) {
        continue;
      }
      smallest = std::min(smallest, need);
      if (need <= ws_bytes) {
        p->algo = perf.algo;
        p->math = m;
        p->ws_need = need;
        found = true;
        break;
      }
    }
    if (!found) {
      FailValue(op, "no cuDNN algorithm for this convolution fits the workspace of " + std::to_string(ws_bytes) +
                        " bytes" + (smallest == SIZE_MAX ? std::string(" (cuDNN offered none)")
                                                          : " (the smallest needs " + std::to_string(smallest) + ")"));
    }
  }
  CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, p->math), op, "cudnnSetConvolutionMathType");
  // cudnnConvolutionBiasActivationForward: RELU with any algorithm, IDENTITY only with
  // IMPLICIT_PRECOMP_GEMM, no clipped relu; otherwise convolution + our bias/activation kernel.
  p->fused = a.act == 1 || (a.act == 0 && p->algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
  (void)has_z;
}

void ConvImpl(const char* op, const TensorView& x, const TensorView& w, const TensorView& b, const TensorView* z,
              const Shape& attrs, const TensorView& y, const TensorView& workspace) {
  const ConvCall call = CheckConv(op, x, w, b, z, attrs, y, workspace);
  if (call.empty) return;
  const ConvAttrs& a = call.a;
  const int dev = call.dev, dtype = call.dtype;
  const int64_t* xs = call.xs.data();
  const int64_t* wsh = call.wsh.data();
  const std::array<int64_t, 4>& ys = call.ys;
  const Workspace& ws = call.ws;

  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cudnnHandle_t h = CudnnHandle(dev, stream, op);

  ConvKey key{dev, dtype, z != nullptr, xs[0], xs[1], xs[2], xs[3], wsh[0], wsh[1], wsh[2], wsh[3],
              a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, a.act, a.algo, a.tf32,
              int64_t(ws.bytes), a.layout};
  ConvPlan* p;
  {
    std::lock_guard<std::mutex> lock(ConvMutex());
    auto& slot = ConvPlans()[key];
    if (!slot) {
      auto plan = std::make_unique<ConvPlan>();
      MakeConvDescs(op, &plan->d, dtype, xs, wsh, ys, a);
      ChooseAlgo(op, h, plan.get(), dtype, a, ws.bytes, z != nullptr);
      std::ostringstream os;
      os << (z ? kConvAdd : kConv) << " cuda:" << dev << " " << DTypeName(dtype) << " x=" << ShapeStr(xs, 4)
         << " w=" << ShapeStr(wsh, 4) << " attrs=" << ShapeStr(attrs.data(), int(attrs.size())) << " workspace=" << ws.bytes
         << " -> algo=" << int(plan->algo) << " math=" << MathName(plan->math) << " needs=" << plan->ws_need;
      plan->desc = os.str();
      slot = std::move(plan);
    }
    p = slot.get();
  }

  std::lock_guard<std::mutex> lock(p->mu);
  void* yp = DataPtr(y);
  const void* zp = z ? DataPtr(*z) : nullptr;
  const float one = 1.0f, zero = 0.0f;
  std::string ctx = "x " + ShapeStr(x) + ", w " + ShapeStr(w) + ", algo " + std::to_string(int(p->algo));
  if (p->fused) {
    const float alpha2 = z ? 1.0f : 0.0f;
    cudnnStatus_t st = cudnnConvolutionBiasActivationForward(
        h, &one, p->d.x, DataPtr(x), p->d.w, DataPtr(w), p->d.conv, p->algo, ws.ptr, ws.bytes, &alpha2, p->d.y,
        z ? zp : yp, p->d.bias, DataPtr(b), p->d.act, p->d.y, yp);
    if (st == CUDNN_STATUS_SUCCESS) {
      p->fused_checked = true;
      return;
    }
    int category = CUDNN_STATUS_CATEGORY(int(st));  // cuDNN 9 statuses carry sub-codes (3002 = NOT_SUPPORTED_SHAPE)
    if (p->fused_checked || (category != CUDNN_STATUS_NOT_SUPPORTED && category != CUDNN_STATUS_BAD_PARAM)) {
      CheckCudnn(st, op, "cudnnConvolutionBiasActivationForward", ctx);
    }
    p->fused = false;  // this configuration cannot be fused: from now on convolution + epilogue kernel
    char drop[256];
    cudnnGetLastErrorString(drop, sizeof(drop));  // clear cuDNN's last error message
  }
  // unfused: y = conv(x, w) (+ y when z aliases y), then y = act(y + b (+ z))
  bool z_is_y = z && zp == yp;
  CheckCudnn(cudnnConvolutionForward(h, &one, p->d.x, DataPtr(x), p->d.w, DataPtr(w), p->d.conv, p->algo, ws.ptr,
                                     ws.bytes, z_is_y ? &one : &zero, p->d.y, yp),
             op, "cudnnConvolutionForward", ctx);
  LaunchConvBiasAct(op, call, yp, DataPtr(b), z_is_y ? nullptr : zp, stream);
}

void Conv2d(TensorView x, TensorView w, TensorView b, Shape attrs, TensorView y, TensorView workspace) {
  ConvImpl(kConv, x, w, b, nullptr, attrs, y, workspace);
}

void Conv2dAdd(TensorView x, TensorView w, TensorView b, TensorView z, Shape attrs, TensorView y,
               TensorView workspace) {
  ConvImpl(kConvAdd, x, w, b, &z, attrs, y, workspace);
}

// ---------------------------------------------------------------------------------------------
// cuDNN convolution gradients (a training step's backward pass)
//
//   nimble.cudnn.conv2d_bwd_data(dy, w, attrs, dx, workspace):    dx = dL/dx of y = conv2d(x, w)
//   nimble.cudnn.conv2d_bwd_filter(x, dy, attrs, dw, workspace):  dw = dL/dw of y = conv2d(x, w)
//
// attrs: the forward convolution's (the 10 entries of nimble.cudnn.conv2d; activation must be 0). dx and dw
// are the outputs; their shapes say which forward convolution is meant (with stride > 1 several input sizes
// give one output size). The algorithm is measured on the first call made outside a CUDA graph capture (the
// executor's live run before it captures): every candidate of cuDNN's heuristic whose workspace fits is timed
// on the call's own operands and the fastest is kept. Under a capture the heuristic's first that fits is taken.
// Determinism is not preferred (PyTorch's default, torch.backends.cudnn.deterministic = False): the
// deterministic weight-gradient algorithms took most of a training step's kernel time (see
// benchmarks/findings.md, 'Transformers in fp16 with every peer, training steps on cuDNN, merges, build times,
// serving under load').

enum class BwdKind { kData, kFilter };

struct BwdPlan {
  ConvDescs d;  // x (dx), w (dw), y (dy), conv
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t ws_need = 0;
  std::string desc;
  std::mutex mu;
};

std::map<ConvKey, std::unique_ptr<BwdPlan>>& BwdPlans() {
  static auto* m = new std::map<ConvKey, std::unique_ptr<BwdPlan>>();
  return *m;
}

cudnnStatus_t BwdWorkspace(cudnnHandle_t h, BwdKind kind, const ConvDescs& d, int algo, size_t* need) {
  if (kind == BwdKind::kData) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x,
                                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), need);
  }
  return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), need);
}

// (algo, math type, determinism) in cuDNN's heuristic order, for the configuration's direction
std::vector<std::tuple<int, cudnnMathType_t, bool>> BwdHeuristics(const char* op, cudnnHandle_t h, BwdKind kind,
                                                                  const ConvDescs& d) {
  std::vector<std::tuple<int, cudnnMathType_t, bool>> out;
  int n = 0;
  if (kind == BwdKind::kData) {
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
    CheckCudnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, int(perf.size()), &n, perf.data()),
               op, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    for (int i = 0; i < n; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS) {
        out.emplace_back(int(perf[i].algo), perf[i].mathType, perf[i].determinism == CUDNN_DETERMINISTIC);
      }
    }
  } else {
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
    CheckCudnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, int(perf.size()), &n,
                                                             perf.data()),
               op, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
    for (int i = 0; i < n; ++i) {
      if (perf[i].status == CUDNN_STATUS_SUCCESS) {
        out.emplace_back(int(perf[i].algo), perf[i].mathType, perf[i].determinism == CUDNN_DETERMINISTIC);
      }
    }
  }
  return out;
}

cudnnStatus_t RunBwd(cudnnHandle_t h, BwdKind kind, const BwdPlan& p, const void* in0, const void* in1, void* out,
                     const Workspace& ws) {
  const float one = 1.0f, zero = 0.0f;
  if (kind == BwdKind::kData) {
    return cudnnConvolutionBackwardData(h, &one, p.d.w, in1, p.d.y, in0, p.d.conv,
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), ws.ptr, ws.bytes, &zero,
                                        p.d.x, out);
  }
  return cudnnConvolutionBackwardFilter(h, &one, p.d.x, in0, p.d.y, in1, p.d.conv,
                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), ws.ptr, ws.bytes,
                                        &zero, p.d.w, out);
}

// The algorithm of a new plan: the fastest measured candidate (outside a capture), else the heuristic's first
// whose workspace fits. `timed` gets "algo:us" per candidate timed.
void ChooseBwdAlgo(const char* op, cudnnHandle_t h, BwdKind kind, BwdPlan* p, int dtype, const ConvAttrs& a,
                   const Workspace& ws, const void* in0, const void* in1, void* out, cudaStream_t stream,
                   std::string* timed) {
  const bool tf32 = a.tf32 != 0;
  CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, BaseMath(dtype, tf32)), op, "cudnnSetConvolutionMathType");
  std::vector<std::tuple<int, cudnnMathType_t, size_t>> fits;  // (algo, math, workspace needed)
  size_t smallest = SIZE_MAX;
  for (const auto& [algo, math, deterministic] : BwdHeuristics(op, h, kind, p->d)) {
    (void)deterministic;
    if (!MathAllowed(dtype, tf32, math)) continue;
    cudnnMathType_t m = (dtype == kF32 && !tf32) ? CUDNN_FMA_MATH : math;
    CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, m), op, "cudnnSetConvolutionMathType");
    size_t need = 0;
    if (BwdWorkspace(h, kind, p->d, algo, &need) != CUDNN_STATUS_SUCCESS) continue;
    smallest = std::min(smallest, need);
    bool seen = false;
    for (const auto& f : fits) seen = seen || (std::get<0>(f) == algo && std::get<1>(f) == m);
    if (need <= ws.bytes && !seen) fits.emplace_back(algo, m, need);
  }
  if (fits.empty()) {
    FailValue(op, "no cuDNN algorithm for this convolution gradient fits the workspace of " + std::to_string(ws.bytes) +
                      " bytes" + (smallest == SIZE_MAX ? std::string(" (cuDNN offered none)")
                                                        : " (the smallest needs " + std::to_string(smallest) + ")"));
  }
  size_t best = 0;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (fits.size() > 1 && cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
      capturing == cudaStreamCaptureStatusNone) {
    double best_us = -1.0;
    for (size_t i = 0; i < fits.size(); ++i) {
      p->algo = std::get<0>(fits[i]);
      p->math = std::get<1>(fits[i]);
      CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, p->math), op, "cudnnSetConvolutionMathType");
      const double us = GpuUsPerCall(stream, 3, [&] { return RunBwd(h, kind, *p, in0, in1, out, ws) == CUDNN_STATUS_SUCCESS; });
      *timed += (timed->empty() ? "" : ",") + std::to_string(p->algo) + ":" +
                (us < 0 ? std::string("failed") : std::to_string(int(us + 0.5)) + "us");
      if (us >= 0 && (best_us < 0 || us < best_us)) {
        best_us = us;
        best = i;
      }
    }
  }
  p->algo = std::get<0>(fits[best]);
  p->math = std::get<1>(fits[best]);
  p->ws_need = std::get<2>(fits[best]);
  CheckCudnn(cudnnSetConvolutionMathType(p->d.conv, p->math), op, "cudnnSetConvolutionMathType");
}

// x [N,C,H,W], w [K,C/g,KH,KW], dy [N,K,P,Q]: `in` is dy (kData) or x (kFilter), `out` is dx or dw.
void ConvBwdImpl(const char* op, BwdKind kind, const TensorView& in0, const TensorView& in1, const Shape& attrs,
                 const TensorView& out, const TensorView& workspace) {
  ConvAttrs a = ParseConvAttrs(op, attrs);
  if (a.act != 0) FailValue(op, "attrs: a convolution gradient takes no activation (entry 7 must be 0)");
  if (a.algo != -1) FailValue(op, "attrs: a convolution gradient chooses its own algorithm (entry 8 must be -1)");
  if (a.layout != 0) FailValue(op, "attrs: a convolution gradient takes NCHW / OIHW only (entry 10 must be 0)");
  if (in0.device().device_type != kDLCUDA) {
    FailValue(op, "inputs must be CUDA tensors, got device type " + std::to_string(in0.device().device_type));
  }
  const int dev = in0.device().device_id;
  const int dtype = TensorDType(in0);
  if (dtype < 0) FailValue(op, "the inputs have dtype " + DLTypeStr(in0.dtype()) + ": " + kDTypesTaken);
  const bool data = kind == BwdKind::kData;
  const TensorView& dy = data ? in0 : in1;
  const TensorView& x = data ? out : in0;  // dx has x's shape
  const TensorView& w = data ? in1 : out;  // dw has w's shape
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"dy", &dy}, {data ? "dx" : "x", &x},
                         {data ? "w" : "dw", &w}}) {
    CheckCudaTensor(op, name, *t, dev);
    CheckDType(op, name, *t, dtype);
    CheckNdim(op, name, *t, 4);
  }
  Workspace ws = CheckWorkspace(op, workspace, dev);
  const int64_t* xs = x.shape().data();
  const int64_t* wsh = w.shape().data();
  std::array<int64_t, 4> ys = ConvOutShape(op, xs, wsh, a);
  for (int i = 0; i < 4; ++i) {
    if (dy.shape()[i] != ys[i]) {
      FailValue(op, "dy has shape " + ShapeStr(dy) + " but the forward convolution of x " + ShapeStr(x) + " and w " +
                        ShapeStr(w) + " with attrs " + ShapeStr(attrs.data(), 10) + " gives " + ShapeStr(ys.data(), 4));
    }
  }
  if (DataPtr(out) == DataPtr(in0) || DataPtr(out) == DataPtr(in1)) FailValue(op, "the output must not alias an input");
  if (xs[0] * xs[1] * xs[2] * xs[3] == 0 || wsh[0] * wsh[1] * wsh[2] * wsh[3] == 0) return;

  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cudnnHandle_t h = CudnnHandle(dev, stream, op);
  ConvKey key{dev, dtype, data ? 1 : 2, xs[0], xs[1], xs[2], xs[3], wsh[0], wsh[1], wsh[2], wsh[3],
              a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, 0, -1, a.tf32,
              int64_t(ws.bytes)};
  BwdPlan* p;
  {
    std::lock_guard<std::mutex> lock(ConvMutex());
    auto& slot = BwdPlans()[key];
    if (!slot) {
      auto plan = std::make_unique<BwdPlan>();
      MakeConvDescs(op, &plan->d, dtype, xs, wsh, ys, a);
      std::string timed;
      ChooseBwdAlgo(op, h, kind, plan.get(), dtype, a, ws, DataPtr(in0), DataPtr(in1), DataPtr(out), stream, &timed);
      std::ostringstream os;
      os << op << " cuda:" << dev << " " << DTypeName(dtype) << " x=" << ShapeStr(xs, 4) << " w=" << ShapeStr(wsh, 4)
         << " attrs=" << ShapeStr(attrs.data(), 10) << " workspace=" << ws.bytes << " -> algo=" << plan->algo
         << " math=" << MathName(plan->math) << " needs=" << plan->ws_need
         << (timed.empty() ? std::string(" (heuristic)") : " (timed " + timed + ")");
      plan->desc = os.str();
      slot = std::move(plan);
    }
    p = slot.get();
  }
  std::lock_guard<std::mutex> lock(p->mu);
  std::string ctx = "x " + ShapeStr(x) + ", w " + ShapeStr(w) + ", algo " + std::to_string(p->algo);
  CheckCudnn(RunBwd(h, kind, *p, DataPtr(in0), DataPtr(in1), DataPtr(out), ws), op,
             data ? "cudnnConvolutionBackwardData" : "cudnnConvolutionBackwardFilter", ctx);
}

void Conv2dBwdData(TensorView dy, TensorView w, Shape attrs, TensorView dx, TensorView workspace) {
  ConvBwdImpl(kConvBwdData, BwdKind::kData, dy, w, attrs, dx, workspace);
}

void Conv2dBwdFilter(TensorView x, TensorView dy, Shape attrs, TensorView dw, TensorView workspace) {
  ConvBwdImpl(kConvBwdFilter, BwdKind::kFilter, x, dy, attrs, dw, workspace);
}

// [[algo, status, workspace_bytes, math_type, determinism], ...] for a configuration, in cuDNN's
// heuristic order, with the math type this extension would use. Needs a GPU (cuDNN handle).
Array<Shape> Conv2dAlgos(Shape x_shape, Shape w_shape, Shape attrs, String dtype_name, int64_t device_id) {
  const char* op = "nimble.cudnn.conv2d_algos";
  ConvAttrs a = ParseConvAttrs(op, attrs);
  if (x_shape.size() != 4 || w_shape.size() != 4) FailValue(op, "x_shape and w_shape must have 4 entries");
  int dtype = DTypeFromName(std::string(dtype_name));
  if (dtype < 0) FailValue(op, "dtype must be \"float32\", \"float16\" or \"bfloat16\", got \"" + std::string(dtype_name) + "\"");
  const std::array<int64_t, 4> xs = Logical(x_shape.data(), a.layout), wsh = Logical(w_shape.data(), a.layout);
  std::array<int64_t, 4> ys = ConvOutShape(op, xs.data(), wsh.data(), a);
  DeviceGuard guard(int(device_id), op);
  cudnnHandle_t h = CudnnHandle(int(device_id), nullptr, op);
  ConvDescs d;
  MakeConvDescs(op, &d, dtype, xs.data(), wsh.data(), ys, a);
  bool tf32 = a.tf32 != 0;
  CheckCudnn(cudnnSetConvolutionMathType(d.conv, BaseMath(dtype, tf32)), op, "cudnnSetConvolutionMathType");
  Array<Shape> out;
  for (const auto& perf : Heuristics(op, h, d)) {
    size_t need = perf.memory;
    cudnnMathType_t m = (dtype == kF32 && !tf32) ? CUDNN_FMA_MATH : perf.mathType;
    int64_t status = perf.status;
    if (status == CUDNN_STATUS_SUCCESS) {
      if (!MathAllowed(dtype, tf32, perf.mathType)) {
        status = CUDNN_STATUS_NOT_SUPPORTED;
      } else {
        cudnnSetConvolutionMathType(d.conv, m);
        if (cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, perf.algo, &need) != CUDNN_STATUS_SUCCESS) {
          status = CUDNN_STATUS_NOT_SUPPORTED;
        }
      }
    }
    out.push_back(Shape({int64_t(perf.algo), status, int64_t(need), int64_t(m), int64_t(perf.determinism)}));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt GEMM. Row-major y[M,N] = a[M,K] @ op(b) is computed as the column-major product
// y^T[N,M] = op(b)^T[N,K] @ a^T[K,M]: cuBLASLt's "A" is our b, its "B" is our a, and the bias
// epilogue adds bias[N] along D's rows.
//
// The algorithm: cuBLASLt's heuristic lists up to kMaxAlgos candidates that fit the workspace; attrs
// carry the index of the one to run (0: the heuristic's first). The heuristic's first is often not
// the fastest at small M (few tiles for 132 SMs), so the build times every candidate with
// nimble.cublas.matmul_timings / batched_matmul_timings and bakes the fastest index into attrs.
//
// A GEMM with a bias lists its candidates in groups: the heuristic's list with the bias (and ReLU) in
// cuBLASLt's epilogue, then split-K variants of those (AddSplitKVariants), then the same two without an
// epilogue, the bias added by our BiasAct kernel after the GEMM (a launch more, and other kernels). At
// batch 1 the heuristic's first is rarely the fastest, and the bias epilogue can be slower than the GEMM
// and our kernel (see benchmarks/findings.md, 'GEMMs at batch 1, build times, bf16 accuracy'). Index 0
// stays the heuristic's first with the epilogue, so indices baked into earlier artifacts keep their meaning.

constexpr int kMaxAlgos = 16;
constexpr int kMaxCandidates = 160;  // the heuristic's, with and without the bias epilogue, and split-K variants

struct MatmulPlan {
  cublasLtMatmulDesc_t desc_epilogue = nullptr, desc_plain = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;  // the selected candidate's (one of the two above, not owned)
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;  // heuristic order, each fits the workspace
  std::vector<bool> with_epilogue;                          // per candidate: bias in cuBLASLt's epilogue
  cublasLtMatmulAlgo_t algo;
  int algo_index = 0;  // into candidates (the requested index, or 0 when the list is shorter)
  size_t ws_need = 0;
  bool epilogue_bias = true;  // the selected candidate's: bias (and relu) in cuBLASLt's epilogue; else our kernel
  std::string desc_str;
  std::mutex mu;
  ~MatmulPlan() {
    if (desc_epilogue) cublasLtMatmulDescDestroy(desc_epilogue);
    if (desc_plain) cublasLtMatmulDescDestroy(desc_plain);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
  }
  void Select(int index) {
    algo_index = index < int(candidates.size()) ? index : 0;
    algo = candidates[algo_index].algo;
    ws_need = candidates[algo_index].workspaceSize;
    epilogue_bias = with_epilogue[algo_index];
    desc = epilogue_bias ? desc_epilogue : desc_plain;
  }
};

using MatmulKey = std::array<int64_t, 16>;  // ..., batch (0: the bias GEMM, >= 1: batched, no bias), algo index, y dtype

std::mutex& MatmulMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::map<MatmulKey, std::unique_ptr<MatmulPlan>>& MatmulPlans() {
  static auto* m = new std::map<MatmulKey, std::unique_ptr<MatmulPlan>>();
  return *m;
}

// A matmul descriptor: fp32 accumulation in every dtype (TF32 tensor cores only for fp32 with tf32
// allowed), op(A) = our b, optionally with the bias (and ReLU) epilogue.
cublasLtMatmulDesc_t MakeMatmulDesc(const char* op, int dtype, bool tb, int act, bool tf32, const void* bias,
                                    bool epilogue_bias) {
  cublasComputeType_t compute = dtype == kF32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc = nullptr;
  CheckCublas(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), op, "cublasLtMatmulDescCreate");
  cublasOperation_t ta = tb ? CUBLAS_OP_T : CUBLAS_OP_N, tn = CUBLAS_OP_N;
  CheckCublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), op,
              "cublasLtMatmulDescSetAttribute(TRANSA)");
  CheckCublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tn, sizeof(tn)), op,
              "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (epilogue_bias) {
    cublasLtEpilogue_t epi = act == 1   ? CUBLASLT_EPILOGUE_RELU_BIAS
                             : act == 4 ? CUBLASLT_EPILOGUE_GELU_BIAS
                                        : CUBLASLT_EPILOGUE_BIAS;
    CheckCublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), op,
                "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    CheckCublas(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), op,
                "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  return desc;
}

// Split-K variants of the heuristic's candidates [from, end): at batch 1 a GEMM has too few output
// tiles for 132 SMs, and the heuristic's list (8 entries for ViT-B's [197, 3072] x [3072, 768] in fp32)
// leaves out split counts that PyTorch's cuBLAS calls reach. Each variant that cuBLASLt accepts for this
// descriptor (cublasLtMatmulAlgoCheck) and whose workspace fits becomes a candidate; the build times all
// of them. Variants of an algorithm already split are skipped (the heuristic chose that count).
void AddSplitKVariants(cublasLtHandle_t lt, MatmulPlan* p, cublasLtMatmulDesc_t desc, bool epilogue, size_t ws_bytes,
                       size_t from) {
  static const int32_t kSplits[] = {2, 3, 4, 6, 8, 12, 16};
  const size_t end = p->candidates.size();
  for (size_t i = from; i < end && p->candidates.size() < size_t(kMaxCandidates); ++i) {
    cublasLtMatmulAlgo_t base = p->candidates[i].algo;
    int32_t support = 0, current = 1;
    size_t got = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof(support), &got) !=
            CUBLAS_STATUS_SUCCESS || !support) {
      continue;
    }
    cublasLtMatmulAlgoConfigGetAttribute(&base, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &current, sizeof(current), &got);
    if (current > 1) continue;
    uint32_t schemes = 0;
    cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes), &got);
    // a separate reduction in the compute type keeps fp32 accumulation; in place is the fallback
    uint32_t scheme = (schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
                      : (schemes & CUBLASLT_REDUCTION_SCHEME_INPLACE)   ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                                                                         : 0;
    if (scheme == 0) continue;
    for (int32_t k : kSplits) {
      if (p->candidates.size() >= size_t(kMaxCandidates)) break;
      cublasLtMatmulAlgo_t algo = base;
      if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof(k)) !=
              CUBLAS_STATUS_SUCCESS ||
          cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) !=
              CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      cublasLtMatmulHeuristicResult_t r{};
      if (cublasLtMatmulAlgoCheck(lt, desc, p->la, p->lb, p->ld, p->ld, &algo, &r) != CUBLAS_STATUS_SUCCESS ||
          r.workspaceSize > ws_bytes) {
        continue;
      }
      r.algo = algo;
      r.state = CUBLAS_STATUS_SUCCESS;
      p->candidates.push_back(r);
      p->with_epilogue.push_back(epilogue);
    }
  }
}

// Appends the heuristic's candidates for `desc` (those that fit the workspace) to p; false when
// cuBLASLt supports no algorithm for it.
bool AddCandidates(const char* op, cublasLtHandle_t lt, MatmulPlan* p, cublasLtMatmulDesc_t desc, bool epilogue,
                   size_t ws_bytes, const std::array<uint32_t, 4>& align) {
  cublasLtMatmulPreference_t pref;
  CheckCublas(cublasLtMatmulPreferenceCreate(&pref), op, "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(&cublasLtMatmulPreferenceDestroy)> guard(
      pref, &cublasLtMatmulPreferenceDestroy);
  uint64_t wsb = ws_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
  // align = {our b (cuBLASLt A), our a (cuBLASLt B), y (C and D), bias}
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof(uint32_t));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof(uint32_t));
  cublasLtMatmulHeuristicResult_t res[kMaxAlgos];
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, desc, p->la, p->lb, p->ld, p->ld, pref, kMaxAlgos, res, &n);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  CheckCublas(st, op, "cublasLtMatmulAlgoGetHeuristic");
  size_t before = p->candidates.size();
  for (int i = 0; i < n; ++i) {
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ws_bytes) {
      p->candidates.push_back(res[i]);
      p->with_epilogue.push_back(epilogue);
    }
  }
  AddSplitKVariants(lt, p, desc, epilogue, ws_bytes, before);
  return p->candidates.size() > before;
}

// The layouts and the candidates of one GEMM (y = a @ op(b) over `batch` strided matrices); a bias GEMM
// (bias != nullptr) lists the epilogue's candidates, then those without; false when there are none.
cudaDataType_t CudaType(int dtype) { return dtype == kF16 ? CUDA_R_16F : dtype == kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// (out_dtype: y's, and C's and the bias's with it; fp32 accumulation either way)
bool MakeMatmulPlan(const char* op, cublasLtHandle_t lt, MatmulPlan* p, int dtype, int out_dtype, int64_t M, int64_t N,
                    int64_t K, bool tb, int act, bool tf32, size_t ws_bytes, const std::array<uint32_t, 4>& align,
                    const void* bias, int64_t batch) {
  cudaDataType_t dt = CudaType(dtype);
  // cuBLASLt "A" = our b: op(A) is [N, K]; stored column-major as [K, N] (ld K) if transpose_b else [N, K] (ld N)
  if (tb) {
    CheckCublas(cublasLtMatrixLayoutCreate(&p->la, dt, uint64_t(K), uint64_t(N), K), op, "cublasLtMatrixLayoutCreate(A)");
  } else {
    CheckCublas(cublasLtMatrixLayoutCreate(&p->la, dt, uint64_t(N), uint64_t(K), N), op, "cublasLtMatrixLayoutCreate(A)");
  }
  CheckCublas(cublasLtMatrixLayoutCreate(&p->lb, dt, uint64_t(K), uint64_t(M), K), op, "cublasLtMatrixLayoutCreate(B)");
  CheckCublas(cublasLtMatrixLayoutCreate(&p->ld, CudaType(out_dtype), uint64_t(N), uint64_t(M), N), op,
              "cublasLtMatrixLayoutCreate(D)");
  if (batch > 1) {  // strided batches: matrix i starts i * rows * cols elements after matrix 0
    int32_t count = int32_t(batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {{p->la, N * K}, {p->lb, K * M}, {p->ld, N * M}};
    for (const auto& [layout, stride] : layouts) {
      CheckCublas(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), op,
                  "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
      CheckCublas(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                   sizeof(stride)),
                  op, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
    }
  }
  if (bias) {
    p->desc_epilogue = MakeMatmulDesc(op, dtype, tb, act, tf32, bias, true);
    AddCandidates(op, lt, p, p->desc_epilogue, true, ws_bytes, align);
  }
  p->desc_plain = MakeMatmulDesc(op, dtype, tb, act, tf32, nullptr, false);
  AddCandidates(op, lt, p, p->desc_plain, false, ws_bytes, align);
  return !p->candidates.empty();
}

// One GEMM call's operands, checked: y = act(a @ op(b) [+ bias]) over `batch` strided matrices.
struct GemmCall {
  const char* op;
  int dev = 0, dtype = 0, out_dtype = 0;  // out_dtype: y's (and the bias's and z's): dtype, or fp32
  bool batched = false;                    // false: the bias GEMM (a's rows flattened)
  int64_t M = 0, N = 0, K = 0, batch = 1;  // batch: the number of strided matrices when batched
  int64_t tb = 0, act = 0, tf32 = 0, algo = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* bias = nullptr;
  const void* z = nullptr;  // matmul_add's residual: cuBLASLt's C with beta = 1
  void* y = nullptr;
  Workspace ws;
  std::string attrs_str;
};

void CheckAlgoIndex(const char* op, int64_t algo, const Shape& attrs) {
  if (algo < 0 || algo >= kMaxCandidates) {
    FailValue(op, "attrs " + ShapeStr(attrs.data(), int(attrs.size())) + ": the algorithm index must be in [0, " +
                      std::to_string(kMaxCandidates) + ")");
  }
}

GemmCall CheckMatmul(TensorView a, TensorView b, TensorView bias, const Shape& attrs, TensorView y, TensorView workspace) {
  GemmCall g;
  const char* op = g.op = kMatmul;
  if (attrs.size() != 3 && attrs.size() != 4) {
    FailValue(op, "attrs must have 3 or 4 entries [transpose_b, activation, allow_tf32(, algorithm index)], got " +
                      ShapeStr(attrs.data(), int(attrs.size())));
  }
  g.tb = attrs[0], g.act = attrs[1], g.tf32 = attrs[2], g.algo = attrs.size() == 4 ? attrs[3] : 0;
  if ((g.tb != 0 && g.tb != 1) || g.act < 0 || g.act > kMaxActivation || (g.tf32 != 0 && g.tf32 != 1)) {
    FailValue(op, "attrs " + ShapeStr(attrs.data(), int(attrs.size())) +
                      ": transpose_b and allow_tf32 must be 0 or 1, activation " + kActivations);
  }
  CheckAlgoIndex(op, g.algo, attrs);
  if (a.device().device_type != kDLCUDA) {
    FailValue(op, "a must be a CUDA tensor, got device type " + std::to_string(a.device().device_type));
  }
  g.dev = a.device().device_id;
  g.dtype = TensorDType(a);
  if (g.dtype < 0) FailValue(op, "a has dtype " + DLTypeStr(a.dtype()) + ": " + kDTypesTaken);
  CheckCudaTensor(op, "a", a, g.dev);
  CheckCudaTensor(op, "b", b, g.dev);
  CheckCudaTensor(op, "bias", bias, g.dev);
  CheckCudaTensor(op, "y", y, g.dev);
  CheckDType(op, "b", b, g.dtype);
  g.out_dtype = GemmOutDType(op, g.dtype, y, bias);
  if (a.ndim() < 2) FailValue(op, "a must be at least 2-D [..., M, K], got " + ShapeStr(a));
  CheckNdim(op, "b", b, 2);
  CheckNdim(op, "bias", bias, 1);
  g.ws = CheckWorkspace(op, workspace, g.dev);
  g.K = a.shape()[a.ndim() - 1];
  g.M = a.numel() / std::max<int64_t>(g.K, 1);
  g.N = g.tb ? b.shape()[0] : b.shape()[1];
  int64_t Kb = g.tb ? b.shape()[1] : b.shape()[0];
  if (Kb != g.K) {
    FailValue(op, "a " + ShapeStr(a) + " and b " + ShapeStr(b) +
                      (g.tb ? " ([N, K], transpose_b=1)" : " ([K, N], transpose_b=0)") + " disagree on K");
  }
  if (bias.shape()[0] != g.N && bias.shape()[0] != 0) {
    FailValue(op, "bias has shape " + ShapeStr(bias) + " but N = " + std::to_string(g.N) + " (or 0: no bias)");
  }
  CheckRows(op, y, g.M, g.N, "a " + ShapeStr(a) + " and N = " + std::to_string(g.N));
  if (g.M != 0 && g.N != 0 && g.K == 0) FailValue(op, "K = 0 is not supported");
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(b)) FailValue(op, "y must not alias a or b");
  g.a = DataPtr(a), g.b = DataPtr(b), g.bias = bias.shape()[0] == 0 ? nullptr : DataPtr(bias), g.y = DataPtr(y);
  g.attrs_str = ShapeStr(attrs.data(), int(attrs.size()));
  return g;
}

GemmCall CheckBatchedMatmul(TensorView a, TensorView b, const Shape& attrs, TensorView y, TensorView workspace) {
  GemmCall g;
  const char* op = g.op = kBatchedMatmul;
  if (attrs.size() != 2 && attrs.size() != 3) {
    FailValue(op, "attrs must have 2 or 3 entries [transpose_b, allow_tf32(, algorithm index)], got " +
                      ShapeStr(attrs.data(), int(attrs.size())));
  }
  g.tb = attrs[0], g.tf32 = attrs[1], g.algo = attrs.size() == 3 ? attrs[2] : 0;
  if ((g.tb != 0 && g.tb != 1) || (g.tf32 != 0 && g.tf32 != 1)) {
    FailValue(op, "attrs " + ShapeStr(attrs.data(), int(attrs.size())) + ": transpose_b and allow_tf32 must be 0 or 1");
  }
  CheckAlgoIndex(op, g.algo, attrs);
  if (a.device().device_type != kDLCUDA) {
    FailValue(op, "a must be a CUDA tensor, got device type " + std::to_string(a.device().device_type));
  }
  g.dev = a.device().device_id;
  g.dtype = TensorDType(a);
  if (g.dtype < 0) FailValue(op, "a has dtype " + DLTypeStr(a.dtype()) + ": " + kDTypesTaken);
  CheckCudaTensor(op, "a", a, g.dev);
  CheckCudaTensor(op, "b", b, g.dev);
  CheckCudaTensor(op, "y", y, g.dev);
  CheckDType(op, "b", b, g.dtype);
  CheckDType(op, "y", y, g.dtype);
  g.out_dtype = g.dtype;
  int nd = a.ndim();
  if (nd < 3 || b.ndim() != nd || y.ndim() != nd) {
    FailValue(op, "a, b and y must have the same rank >= 3 [..., rows, cols], got a " + ShapeStr(a) + ", b " + ShapeStr(b) +
                      ", y " + ShapeStr(y));
  }
  g.batched = true;
  g.batch = 1;
  for (int i = 0; i + 2 < nd; ++i) {
    if (b.shape()[i] != a.shape()[i] || y.shape()[i] != a.shape()[i]) {
      FailValue(op, "a " + ShapeStr(a) + ", b " + ShapeStr(b) + " and y " + ShapeStr(y) +
                        " must have the same leading (batch) dimensions");
    }
    g.batch *= a.shape()[i];
  }
  g.ws = CheckWorkspace(op, workspace, g.dev);
  g.M = a.shape()[nd - 2], g.K = a.shape()[nd - 1];
  g.N = g.tb ? b.shape()[nd - 2] : b.shape()[nd - 1];
  int64_t Kb = g.tb ? b.shape()[nd - 1] : b.shape()[nd - 2];
  if (Kb != g.K) FailValue(op, "a " + ShapeStr(a) + " and b " + ShapeStr(b) + " disagree on K");
  if (y.shape()[nd - 2] != g.M || y.shape()[nd - 1] != g.N) {
    FailValue(op, "y has shape " + ShapeStr(y) + " but a @ op(b) gives [..., " + std::to_string(g.M) + ", " +
                      std::to_string(g.N) + "]");
  }
  if (g.batch != 0 && g.M != 0 && g.N != 0 && g.K == 0) FailValue(op, "K = 0 is not supported");
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(b)) FailValue(op, "y must not alias a or b");
  g.a = DataPtr(a), g.b = DataPtr(b), g.y = DataPtr(y);
  g.attrs_str = ShapeStr(attrs.data(), int(attrs.size()));
  return g;
}

bool GemmEmpty(const GemmCall& g) { return g.M == 0 || g.N == 0 || g.batch == 0; }

// The alignment both C (the residual, when there is one) and D (y) have.
uint32_t CAlign(const GemmCall& g) { return g.z ? std::min(PtrAlign(g.y), PtrAlign(g.z)) : PtrAlign(g.y); }

// A fresh plan for g (its algorithm list, index g.algo selected).
std::unique_ptr<MatmulPlan> MakeGemmPlan(const GemmCall& g, cublasLtHandle_t lt) {
  std::array<uint32_t, 4> align{PtrAlign(g.b), PtrAlign(g.a), CAlign(g), g.bias ? PtrAlign(g.bias) : 0};
  auto plan = std::make_unique<MatmulPlan>();
  bool ok = g.batched ? MakeMatmulPlan(g.op, lt, plan.get(), g.dtype, g.out_dtype, g.M, g.N, g.K, g.tb, 0, g.tf32,
                                       g.ws.bytes, align, nullptr, g.batch)
                      : MakeMatmulPlan(g.op, lt, plan.get(), g.dtype, g.out_dtype, g.M, g.N, g.K, g.tb, int(g.act),
                                       g.tf32, g.ws.bytes, align, g.bias, 1);
  if (!ok) {
    TVM_FFI_THROW(RuntimeError) << g.op << ": cublasLtMatmulAlgoGetHeuristic found no algorithm for "
                                << (g.batched ? "batch=" + std::to_string(g.batch) + " " : std::string()) << "M=" << g.M
                                << " N=" << g.N << " K=" << g.K << " " << DTypeName(g.dtype) << " -> "
                                << DTypeName(g.out_dtype) << " within " << g.ws.bytes
                                << " workspace bytes";
  }
  plan->Select(int(g.algo));
  std::ostringstream os;
  os << g.op << " cuda:" << g.dev << " " << DTypeName(g.dtype)
     << (g.out_dtype != g.dtype ? std::string(" -> ") + DTypeName(g.out_dtype) : std::string())
     << (g.batched ? " batch=" + std::to_string(g.batch) : "")
     << " M=" << g.M << " N=" << g.N << " K=" << g.K << " attrs=" << g.attrs_str << " workspace=" << g.ws.bytes;
  if (!g.batched) {
    os << " -> epilogue=" << (plan->epilogue_bias ? (g.act == 1 ? "relu_bias" : g.act == 4 ? "gelu_bias" : "bias") : "none")
       << (g.act == 2 || g.act == 3 || !plan->epilogue_bias ? "+kernel" : "");
  }
  os << " algo=" << plan->algo_index << "/" << plan->candidates.size() << " needs=" << plan->ws_need;
  plan->desc_str = os.str();
  return plan;
}

MatmulKey GemmKey(const GemmCall& g) {
  return MatmulKey{g.dev, g.dtype, g.M, g.N, g.K, g.tb, g.act, g.tf32, int64_t(g.ws.bytes), PtrAlign(g.b), PtrAlign(g.a),
                   CAlign(g), g.bias ? PtrAlign(g.bias) : 0, g.batched ? g.batch : (g.z ? -1 : 0), g.algo,
                   g.out_dtype};
}

// Enqueues one GEMM with plan p (its mutex held) on `stream`.
void EnqueueGemm(const GemmCall& g, MatmulPlan* p, cublasLtHandle_t lt, cudaStream_t stream) {
  if (!g.batched && p->epilogue_bias) {
    const void* bp = g.bias;
    CheckCublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)), g.op,
                "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  const float one = 1.0f, zero = 0.0f;
  CheckCublas(cublasLtMatmul(lt, p->desc, &one, g.b, p->la, g.a, p->lb, g.z ? &one : &zero, g.z ? g.z : g.y, p->ld,
                             g.y, p->ld, &p->algo, g.ws.ptr, g.ws.bytes, stream),
              g.op, "cublasLtMatmul",
              (g.batched ? "batch=" + std::to_string(g.batch) + " " : std::string()) + "M=" + std::to_string(g.M) +
                  " N=" + std::to_string(g.N) + " K=" + std::to_string(g.K));
  if (!g.batched && !p->epilogue_bias && (g.bias != nullptr || g.act != 0)) {  // (no bias, no activation: the GEMM)
    LaunchBiasAct(g.op, g.out_dtype, g.y, g.bias, nullptr, g.M * g.N, 1, g.N, int(g.act), stream);
  } else if (!g.batched && (g.act == 2 || g.act == 3)) {  // relu6, erf gelu: not in cuBLASLt's epilogues
    LaunchBiasAct(g.op, g.out_dtype, g.y, nullptr, nullptr, g.M * g.N, 1, g.N, int(g.act), stream);
  }
}

void RunGemm(const GemmCall& g) {
  if (GemmEmpty(g)) return;
  DeviceGuard guard(g.dev, g.op);
  cudaStream_t stream = CurrentStream(g.dev);
  cublasLtHandle_t lt = LtHandle(g.dev, stream, g.op);
  MatmulPlan* p;
  {
    std::lock_guard<std::mutex> lock(MatmulMutex());
    auto& slot = MatmulPlans()[GemmKey(g)];
    if (!slot) slot = MakeGemmPlan(g, lt);
    p = slot.get();
  }
  std::lock_guard<std::mutex> lock(p->mu);
  EnqueueGemm(g, p, lt, stream);
}

void Matmul(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  RunGemm(CheckMatmul(a, b, bias, attrs, y, workspace));
}

GemmCall CheckMatmulAdd(TensorView a, TensorView b, TensorView bias, TensorView z, const Shape& attrs, TensorView y,
                        TensorView workspace) {
  GemmCall g = CheckMatmul(a, b, bias, attrs, y, workspace);
  g.op = kMatmulAdd;
  CheckCudaTensor(g.op, "z", z, g.dev);
  CheckDType(g.op, "z", z, g.out_dtype);
  bool same = z.ndim() == y.ndim();
  for (int i = 0; same && i < y.ndim(); ++i) same = z.shape()[i] == y.shape()[i];
  if (!same) FailValue(g.op, "z has shape " + ShapeStr(z) + " but y has " + ShapeStr(y) + ": they must be equal");
  g.z = DataPtr(z);
  return g;
}

void MatmulAdd(TensorView a, TensorView b, TensorView bias, TensorView z, Shape attrs, TensorView y,
               TensorView workspace) {
  RunGemm(CheckMatmulAdd(a, b, bias, z, attrs, y, workspace));
}

void BatchedMatmul(TensorView a, TensorView b, Shape attrs, TensorView y, TensorView workspace) {
  RunGemm(CheckBatchedMatmul(a, b, attrs, y, workspace));
}

// Keeps the GPU busy for `ns` nanoseconds, so that the calls enqueued behind it run back to back,
// as in a CUDA graph, however slowly the host enqueues them.

// Microseconds per call of each algorithm candidate (index = the attrs' algorithm index), each timed
// over `reps` back-to-back calls on the current stream (queued behind a spin kernel: GPU time, not the
// host's enqueue rate) after two warm-up calls; y is overwritten.
// Build-time only: it synchronizes, so it must not run inside a graph capture.
Array<double> TimeGemm(const GemmCall& g, int64_t reps) {
  Array<double> out;
  if (GemmEmpty(g)) return out;
  if (reps < 1) FailValue(g.op, "reps must be >= 1, got " + std::to_string(reps));
  DeviceGuard guard(g.dev, g.op);
  cudaStream_t stream = CurrentStream(g.dev);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CheckCuda(cudaStreamIsCapturing(stream, &capturing), g.op, "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) FailValue(g.op, "timings cannot be taken inside a CUDA graph capture");
  cublasLtHandle_t lt = LtHandle(g.dev, stream, g.op);
  std::unique_ptr<MatmulPlan> plan = MakeGemmPlan(g, lt);
  for (size_t i = 0; i < plan->candidates.size(); ++i) {
    plan->Select(int(i));
    // EnqueueGemm raises on a failed call; a negative time is a failed CUDA event or the spin kernel's launch
    const double us = GpuUsPerCall(stream, reps, [&] {
      EnqueueGemm(g, plan.get(), lt, stream);
      return true;
    });
    if (us < 0) FailValue(g.op, "timing candidate " + std::to_string(i) + " failed (CUDA events or the spin kernel)");
    out.push_back(us);
  }
  return out;
}

Array<double> MatmulTimings(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y, TensorView workspace,
                            int64_t reps) {
  return TimeGemm(CheckMatmul(a, b, bias, attrs, y, workspace), reps);
}

Array<double> MatmulAddTimings(TensorView a, TensorView b, TensorView bias, TensorView z, Shape attrs, TensorView y,
                               TensorView workspace, int64_t reps) {
  return TimeGemm(CheckMatmulAdd(a, b, bias, z, attrs, y, workspace), reps);
}

Array<double> BatchedMatmulTimings(TensorView a, TensorView b, Shape attrs, TensorView y, TensorView workspace,
                                   int64_t reps) {
  return TimeGemm(CheckBatchedMatmul(a, b, attrs, y, workspace), reps);
}
// ---------------------------------------------------------------------------------------------

String Versions() {
  size_t cv = cudnnGetVersion();
  size_t bv = cublasLtGetVersion();
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
  cudaGetLastError();
  std::ostringstream os;
  os << "cudnn " << cv / 10000 << "." << (cv % 10000) / 100 << "." << cv % 100 << ", cublas " << bv / 10000 << "."
     << (bv % 10000) / 100 << "." << bv % 100 << ", cudart " << rt / 1000 << "." << (rt % 1000) / 10 << ", driver ";
  if (drv > 0) {
    os << drv / 1000 << "." << (drv % 1000) / 10;
  } else {
    os << "none";
  }
  return String(os.str());
}

Array<String> Plans() {
  Array<String> out;
  {
    std::lock_guard<std::mutex> lock(ConvMutex());
    for (auto& kv : ConvPlans()) {
      out.push_back(String(kv.second->desc + (kv.second->fused ? " fused" : " unfused")));
    }
    for (auto& kv : BwdPlans()) out.push_back(String(kv.second->desc));
  }
  {
    std::lock_guard<std::mutex> lock(MatmulMutex());
    for (auto& kv : MatmulPlans()) out.push_back(String(kv.second->desc_str));
  }
  return out;
}


__attribute__((constructor)) void RegisterAll() {
  try {
    Register(kConv, Conv2d);
    Register(kConvAdd, Conv2dAdd);
    Register(kConvBwdData, Conv2dBwdData);
    Register(kConvBwdFilter, Conv2dBwdFilter);
    Register(kMatmul, Matmul);
    Register(kBatchedMatmul, BatchedMatmul);
    Register(kMatmulAdd, MatmulAdd);
    Register(kTf32x3Matmul, Matmul);
    Register(kTf32x3MatmulAdd, MatmulAdd);
    Register("nimble.cublas.matmul_add_timings", MatmulAddTimings);
    Register("nimble.cudnn.conv2d_algos", Conv2dAlgos);
    Register("nimble.cublas.matmul_timings", MatmulTimings);
    Register("nimble.cublas.batched_matmul_timings", BatchedMatmulTimings);
    Register("nimble.vendor.versions", Versions);
    Register("nimble.vendor.plans", Plans);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
