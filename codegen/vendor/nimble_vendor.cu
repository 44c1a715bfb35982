// tvm-nimble vendor-kernel extension: cuDNN convolutions and cuBLASLt GEMMs as TVM FFI global
// functions in destination-passing style, so that a Nimble plan launches them like any other
// kernel (R.call_dps_packed("nimble.cudnn.conv2d", ...)), on several streams, inside CUDA graph
// capture.
//
// Functions (registered when this library is loaded; see tvm_nimble/runtime/vendor.py):
//   nimble.cudnn.conv2d(x, w, b, attrs, y, workspace)
//   nimble.cudnn.conv2d_add(x, w, b, z, attrs, y, workspace)
//       y = act(conv2d(x, w) + b [+ z]); NCHW / OIHW; fp32 or fp16; b [O]; z shaped like y.
//       attrs = [stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, activation, algo, allow_tf32]
//       activation: 0 identity, 1 relu, 2 relu6; algo: -1 choose (heuristics, cached), >= 0 forced
//       cudnnConvolutionFwdAlgo_t. Padding is symmetric per axis (pad_h top and bottom, pad_w left
//       and right): that is what cuDNN's convolution descriptor can express.
//   nimble.cublas.matmul(a, b, bias, attrs, y, workspace)
//       y = act(a @ op(b) + bias); a [..., M, K] (rows flattened), b [N, K] if transpose_b else
//       [K, N], bias [N], y [..., M, N]; attrs = [transpose_b, activation, allow_tf32].
//   nimble.cublas.batched_matmul(a, b, attrs, y, workspace)
//       y[i] = a[i] @ op(b[i]) over the leading (batch) dimensions, one strided-batched cuBLASLt call;
//       a [..., M, K], b [..., N, K] if transpose_b else [..., K, N], y [..., M, N], the same leading
//       dimensions everywhere (no broadcasting); attrs = [transpose_b, allow_tf32].
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
#include <utility>
#include <vector>

namespace nimble_vendor {
namespace {

using tvm::ffi::Array;
using tvm::ffi::Shape;
using tvm::ffi::String;
using tvm::ffi::TensorView;

constexpr const char* kConv = "nimble.cudnn.conv2d";
constexpr const char* kConvAdd = "nimble.cudnn.conv2d_add";
constexpr const char* kMatmul = "nimble.cublas.matmul";
constexpr const char* kBatchedMatmul = "nimble.cublas.batched_matmul";
constexpr int64_t kWorkspaceAlign = 256;

enum DType : int { kF32 = 0, kF16 = 1 };

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::string ShapeStr(const int64_t* v, int n) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string ShapeStr(const TensorView& t) { return ShapeStr(t.shape().data(), t.ndim()); }

const char* DTypeName(int d) { return d == kF32 ? "float32" : "float16"; }

std::string DLTypeStr(DLDataType t) {
  std::ostringstream os;
  const char* code = t.code == kDLFloat ? "float" : t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint"
                     : t.code == kDLBfloat ? "bfloat" : "type";
  os << code << int(t.bits);
  if (t.lanes != 1) os << "x" << int(t.lanes);
  return os.str();
}

[[noreturn]] void FailValue(const char* op, const std::string& msg) {
  TVM_FFI_THROW(ValueError) << op << ": " << OneLine(msg);
  throw;  // unreachable: TVM_FFI_THROW throws
}

void CheckCudnn(cudnnStatus_t st, const char* op, const char* call, const std::string& ctx = "") {
  if (st == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string d = OneLine(detail);
  TVM_FFI_THROW(RuntimeError) << op << ": " << call << " failed with " << cudnnGetErrorString(st)
                              << (ctx.empty() ? "" : " (" + ctx + ")") << (d.empty() ? "" : ": " + d);
}

void CheckCublas(cublasStatus_t st, const char* op, const char* call, const std::string& ctx = "") {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  TVM_FFI_THROW(RuntimeError) << op << ": " << call << " failed with " << cublasLtGetStatusName(st)
                              << (ctx.empty() ? "" : " (" + ctx + ")");
}

void CheckCuda(cudaError_t err, const char* op, const char* call) {
  if (err == cudaSuccess) return;
  TVM_FFI_THROW(RuntimeError) << op << ": " << call << " failed with " << cudaGetErrorName(err) << ": "
                              << cudaGetErrorString(err);
}

// ---------------------------------------------------------------------------------------------
// argument checks

int TensorDType(const TensorView& t) {
  DLDataType d = t.dtype();
  if (d.code == kDLFloat && d.lanes == 1 && d.bits == 32) return kF32;
  if (d.code == kDLFloat && d.lanes == 1 && d.bits == 16) return kF16;
  return -1;
}

void* DataPtr(const TensorView& t) { return static_cast<char*>(t.data_ptr()) + t.byte_offset(); }

void CheckCudaTensor(const char* op, const char* name, const TensorView& t, int device_id) {
  if (t.device().device_type != kDLCUDA) {
    FailValue(op, std::string(name) + " must be a CUDA tensor, got device type " +
                      std::to_string(t.device().device_type));
  }
  if (t.device().device_id != device_id) {
    FailValue(op, std::string(name) + " is on cuda:" + std::to_string(t.device().device_id) +
                      " but the first input is on cuda:" + std::to_string(device_id));
  }
  if (!t.IsContiguous()) FailValue(op, std::string(name) + " must be contiguous (row-major, no strides)");
}

void CheckDType(const char* op, const char* name, const TensorView& t, int dtype) {
  if (TensorDType(t) != dtype) {
    FailValue(op, std::string(name) + " has dtype " + DLTypeStr(t.dtype()) + " but " + DTypeName(dtype) +
                      " is expected (all of x/w/b/z/y, or a/b/bias/y, share one dtype)");
  }
}

void CheckNdim(const char* op, const char* name, const TensorView& t, int ndim) {
  if (t.ndim() != ndim) {
    FailValue(op, std::string(name) + " must be " + std::to_string(ndim) + "-D, got shape " + ShapeStr(t));
  }
}

struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// The caller's uint8 workspace, aligned up to 256 bytes (cuDNN/cuBLASLt kernels want aligned scratch).
Workspace CheckWorkspace(const char* op, const TensorView& ws, int device_id) {
  CheckCudaTensor(op, "workspace", ws, device_id);
  DLDataType d = ws.dtype();
  if (!(d.code == kDLUInt && d.bits == 8 && d.lanes == 1) || ws.ndim() != 1) {
    FailValue(op, "workspace must be a 1-D uint8 tensor, got " + DLTypeStr(d) + " " + ShapeStr(ws));
  }
  uintptr_t p = reinterpret_cast<uintptr_t>(DataPtr(ws));
  uintptr_t q = (p + kWorkspaceAlign - 1) & ~uintptr_t(kWorkspaceAlign - 1);
  int64_t len = ws.shape()[0];
  Workspace out;
  if (len > int64_t(q - p)) {
    out.bytes = size_t(len - int64_t(q - p)) & ~size_t(kWorkspaceAlign - 1);
    out.ptr = out.bytes ? reinterpret_cast<void*>(q) : nullptr;
  }
  return out;
}

uint32_t PtrAlign(const void* p) {
  uintptr_t v = reinterpret_cast<uintptr_t>(p);
  if (v == 0) return 256;
  uintptr_t a = v & (~v + 1);
  return uint32_t(std::min<uintptr_t>(a, 256));
}

struct DeviceGuard {
  int prev = -1, target;
  DeviceGuard(int dev, const char* op) : target(dev) {
    CheckCuda(cudaGetDevice(&prev), op, "cudaGetDevice");
    if (prev != target) CheckCuda(cudaSetDevice(target), op, "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (prev >= 0 && prev != target) cudaSetDevice(prev);
  }
};

cudaStream_t CurrentStream(int device_id) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, device_id));
}

// ---------------------------------------------------------------------------------------------
// one cuDNN and one cuBLASLt handle per (device, stream), created on first use, never destroyed
// (process lifetime: destroying them at exit races the driver's own teardown)

struct StreamHandles {
  cudnnHandle_t cudnn = nullptr;
  cublasLtHandle_t lt = nullptr;
};

std::mutex& HandlesMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::map<std::pair<int, void*>, StreamHandles>& Handles() {
  static auto* m = new std::map<std::pair<int, void*>, StreamHandles>();
  return *m;
}

bool Capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

// A stream seen for the first time while it is being captured (a CUDA graph that another system
// captures on a stream of its own, e.g. TVM's VM) cannot create a handle: cudnnCreate allocates.
// It borrows a handle of another stream of the device; the stream is set on every call, so a
// borrowed handle serves both streams (one host thread issues all calls, one after the other).
cudnnHandle_t CudnnHandle(int dev, cudaStream_t stream, const char* op) {
  std::lock_guard<std::mutex> lock(HandlesMutex());
  StreamHandles& h = Handles()[{dev, static_cast<void*>(stream)}];
  if (h.cudnn == nullptr && Capturing(stream)) {
    for (auto& kv : Handles()) {
      if (kv.first.first == dev && kv.second.cudnn != nullptr) {
        h.cudnn = kv.second.cudnn;
        break;
      }
    }
    if (h.cudnn == nullptr) {
      TVM_FFI_THROW(RuntimeError) << op << ": first call on a stream that is being captured; call it once "
                                  << "before capturing (cuDNN cannot create a handle during capture)";
    }
  }
  if (h.cudnn == nullptr) {
    cudnnHandle_t handle;
    CheckCudnn(cudnnCreate(&handle), op, "cudnnCreate");
    h.cudnn = handle;
  }
  CheckCudnn(cudnnSetStream(h.cudnn, stream), op, "cudnnSetStream");
  return h.cudnn;
}

cublasLtHandle_t LtHandle(int dev, cudaStream_t stream, const char* op) {
  std::lock_guard<std::mutex> lock(HandlesMutex());
  StreamHandles& h = Handles()[{dev, static_cast<void*>(stream)}];
  if (h.lt == nullptr && Capturing(stream)) {  // cublasLtMatmul takes the stream per call: any handle serves
    for (auto& kv : Handles()) {
      if (kv.first.first == dev && kv.second.lt != nullptr) {
        h.lt = kv.second.lt;
        break;
      }
    }
  }
  if (h.lt == nullptr) {
    cublasLtHandle_t handle;
    CheckCublas(cublasLtCreate(&handle), op, "cublasLtCreate");
    h.lt = handle;
  }
  return h.lt;
}

// ---------------------------------------------------------------------------------------------
// y = act(y_in + bias[c] (+ z)), c = (i / inner) % channels: the epilogue where cuDNN/cuBLASLt
// cannot fuse it (relu6, identity outside IMPLICIT_PRECOMP_GEMM).

template <typename T>
__device__ __forceinline__ float ToF(T v) { return static_cast<float>(v); }
template <>
__device__ __forceinline__ float ToF<__half>(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T FromF(float v) { return static_cast<T>(v); }
template <>
__device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void BiasActKernel(T* __restrict__ y, const T* __restrict__ bias, const T* z, int64_t n,
                              int64_t inner, int64_t channels, int act) {
  int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = ToF(y[i]);
    if (bias != nullptr) v += ToF(bias[(i / inner) % channels]);
    if (z != nullptr) v += ToF(z[i]);
    if (act >= 1) v = fmaxf(v, 0.0f);
    if (act == 2) v = fminf(v, 6.0f);
    y[i] = FromF<T>(v);
  }
}

void LaunchBiasAct(const char* op, int dtype, void* y, const void* bias, const void* z, int64_t n,
                   int64_t inner, int64_t channels, int act, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65536);
  if (dtype == kF32) {
    BiasActKernel<float><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<float*>(y), static_cast<const float*>(bias), static_cast<const float*>(z), n, inner,
        channels, act);
  } else {
    BiasActKernel<__half><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<__half*>(y), static_cast<const __half*>(bias), static_cast<const __half*>(z), n, inner,
        channels, act);
  }
  CheckCuda(cudaGetLastError(), op, "bias/activation kernel launch");
}

// ---------------------------------------------------------------------------------------------
// cuDNN convolution

struct ConvAttrs {
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, act, algo, tf32;
};

ConvAttrs ParseConvAttrs(const char* op, const Shape& attrs) {
  if (attrs.size() != 10) {
    FailValue(op, "attrs must have 10 entries [stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, "
                  "activation, algo, allow_tf32], got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  ConvAttrs a{attrs[0], attrs[1], attrs[2], attrs[3], attrs[4], attrs[5], attrs[6], attrs[7], attrs[8], attrs[9]};
  std::string s = ShapeStr(attrs.data(), 10);
  if (a.stride_h < 1 || a.stride_w < 1 || a.dil_h < 1 || a.dil_w < 1 || a.pad_h < 0 || a.pad_w < 0 || a.groups < 1) {
    FailValue(op, "attrs " + s + ": strides, dilations and groups must be >= 1 and pads >= 0");
  }
  if (a.act < 0 || a.act > 2) FailValue(op, "attrs " + s + ": activation must be 0 (identity), 1 (relu) or 2 (relu6)");
  if (a.algo < -1 || a.algo >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT) {
    FailValue(op, "attrs " + s + ": algo must be -1 (choose) or a cudnnConvolutionFwdAlgo_t in 0.." +
                      std::to_string(CUDNN_CONVOLUTION_FWD_ALGO_COUNT - 1));
  }
  if (a.tf32 != 0 && a.tf32 != 1) FailValue(op, "attrs " + s + ": allow_tf32 must be 0 or 1");
  return a;
}

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

void MakeConvDescs(const char* op, ConvDescs* d, int dtype, const int64_t* x, const int64_t* w,
                   const std::array<int64_t, 4>& y, const ConvAttrs& a) {
  cudnnDataType_t dt = dtype == kF32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_HALF;
  CheckCudnn(cudnnCreateTensorDescriptor(&d->x), op, "cudnnCreateTensorDescriptor");
  CheckCudnn(cudnnCreateTensorDescriptor(&d->y), op, "cudnnCreateTensorDescriptor");
  CheckCudnn(cudnnCreateTensorDescriptor(&d->bias), op, "cudnnCreateTensorDescriptor");
  CheckCudnn(cudnnCreateFilterDescriptor(&d->w), op, "cudnnCreateFilterDescriptor");
  CheckCudnn(cudnnCreateConvolutionDescriptor(&d->conv), op, "cudnnCreateConvolutionDescriptor");
  CheckCudnn(cudnnCreateActivationDescriptor(&d->act), op, "cudnnCreateActivationDescriptor");
  CheckCudnn(cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, dt, int(x[0]), int(x[1]), int(x[2]), int(x[3])),
             op, "cudnnSetTensor4dDescriptor(x)", "x " + ShapeStr(x, 4));
  CheckCudnn(cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, dt, int(y[0]), int(y[1]), int(y[2]), int(y[3])),
             op, "cudnnSetTensor4dDescriptor(y)", "y " + ShapeStr(y.data(), 4));
  CheckCudnn(cudnnSetTensor4dDescriptor(d->bias, CUDNN_TENSOR_NCHW, dt, 1, int(y[1]), 1, 1), op,
             "cudnnSetTensor4dDescriptor(bias)");
  CheckCudnn(cudnnSetFilter4dDescriptor(d->w, dt, CUDNN_TENSOR_NCHW, int(w[0]), int(w[1]), int(w[2]), int(w[3])),
             op, "cudnnSetFilter4dDescriptor", "w " + ShapeStr(w, 4));
  // fp32 accumulation for both dtypes (fp16: "pseudo half", tensor cores with fp32 accumulate)
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
  if (dtype == kF16) return CUDNN_TENSOR_OP_MATH;
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

using ConvKey = std::array<int64_t, 22>;

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
  ConvAttrs a = ParseConvAttrs(op, attrs);
  if (x.device().device_type != kDLCUDA) {
    FailValue(op, "x must be a CUDA tensor, got device type " + std::to_string(x.device().device_type));
  }
  int dev = x.device().device_id;
  int dtype = TensorDType(x);
  if (dtype < 0) FailValue(op, "x has dtype " + DLTypeStr(x.dtype()) + ": only float32 and float16 are supported");
  CheckCudaTensor(op, "x", x, dev);
  CheckCudaTensor(op, "w", w, dev);
  CheckCudaTensor(op, "b", b, dev);
  CheckCudaTensor(op, "y", y, dev);
  if (z) CheckCudaTensor(op, "z", *z, dev);
  CheckDType(op, "w", w, dtype);
  CheckDType(op, "b", b, dtype);
  CheckDType(op, "y", y, dtype);
  if (z) CheckDType(op, "z", *z, dtype);
  CheckNdim(op, "x", x, 4);
  CheckNdim(op, "w", w, 4);
  CheckNdim(op, "b", b, 1);
  CheckNdim(op, "y", y, 4);
  Workspace ws = CheckWorkspace(op, workspace, dev);
  const int64_t* xs = x.shape().data();
  const int64_t* wsh = w.shape().data();
  std::array<int64_t, 4> ys = ConvOutShape(op, xs, wsh, a);
  if (b.shape()[0] != wsh[0]) {
    FailValue(op, "b has shape " + ShapeStr(b) + " but w " + ShapeStr(w) + " has " + std::to_string(wsh[0]) +
                      " output channels");
  }
  for (int i = 0; i < 4; ++i) {
    if (y.shape()[i] != ys[i]) {
      FailValue(op, "y has shape " + ShapeStr(y) + " but x " + ShapeStr(x) + ", w " + ShapeStr(w) + " and attrs " +
                        ShapeStr(attrs.data(), 10) + " give " + ShapeStr(ys.data(), 4));
    }
    if (z && z->shape()[i] != ys[i]) {
      FailValue(op, "z has shape " + ShapeStr(*z) + " but y has shape " + ShapeStr(ys.data(), 4));
    }
  }
  if (DataPtr(y) == DataPtr(x)) FailValue(op, "y must not alias x");
  if (ys[0] * ys[1] * ys[2] * ys[3] == 0) return;

  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cudnnHandle_t h = CudnnHandle(dev, stream, op);

  ConvKey key{dev, dtype, z != nullptr, xs[0], xs[1], xs[2], xs[3], wsh[0], wsh[1], wsh[2], wsh[3],
              a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w, a.groups, a.act, a.algo, a.tf32,
              int64_t(ws.bytes)};
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
         << " w=" << ShapeStr(wsh, 4) << " attrs=" << ShapeStr(attrs.data(), 10) << " workspace=" << ws.bytes
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
  LaunchBiasAct(op, dtype, yp, DataPtr(b), z_is_y ? nullptr : zp, ys[0] * ys[1] * ys[2] * ys[3], ys[2] * ys[3], ys[1],
                int(a.act), stream);
}

void Conv2d(TensorView x, TensorView w, TensorView b, Shape attrs, TensorView y, TensorView workspace) {
  ConvImpl(kConv, x, w, b, nullptr, attrs, y, workspace);
}

void Conv2dAdd(TensorView x, TensorView w, TensorView b, TensorView z, Shape attrs, TensorView y,
               TensorView workspace) {
  ConvImpl(kConvAdd, x, w, b, &z, attrs, y, workspace);
}

// [[algo, status, workspace_bytes, math_type, determinism], ...] for a configuration, in cuDNN's
// heuristic order, with the math type this extension would use. Needs a GPU (cuDNN handle).
Array<Shape> Conv2dAlgos(Shape x_shape, Shape w_shape, Shape attrs, String dtype_name, int64_t device_id) {
  const char* op = "nimble.cudnn.conv2d_algos";
  ConvAttrs a = ParseConvAttrs(op, attrs);
  if (x_shape.size() != 4 || w_shape.size() != 4) FailValue(op, "x_shape and w_shape must have 4 entries");
  int dtype = dtype_name == "float32" ? kF32 : dtype_name == "float16" ? kF16 : -1;
  if (dtype < 0) FailValue(op, "dtype must be \"float32\" or \"float16\", got \"" + std::string(dtype_name) + "\"");
  std::array<int64_t, 4> ys = ConvOutShape(op, x_shape.data(), w_shape.data(), a);
  DeviceGuard guard(int(device_id), op);
  cudnnHandle_t h = CudnnHandle(int(device_id), nullptr, op);
  ConvDescs d;
  MakeConvDescs(op, &d, dtype, x_shape.data(), w_shape.data(), ys, a);
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

struct MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo;
  size_t ws_need = 0;
  bool epilogue_bias = true;  // bias (and relu) in cuBLASLt's epilogue; else in our kernel
  std::string desc_str;
  std::mutex mu;
  ~MatmulPlan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
  }
};

using MatmulKey = std::array<int64_t, 14>;  // ..., batch (0: the bias GEMM, >= 1: batched, no bias)

std::mutex& MatmulMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::map<MatmulKey, std::unique_ptr<MatmulPlan>>& MatmulPlans() {
  static auto* m = new std::map<MatmulKey, std::unique_ptr<MatmulPlan>>();
  return *m;
}

// Builds the descriptors for one epilogue; returns false when cuBLASLt offers no algorithm.
bool TryMatmulPlan(const char* op, cublasLtHandle_t lt, MatmulPlan* p, int dtype, int64_t M, int64_t N, int64_t K,
                   bool tb, int act, bool tf32, size_t ws_bytes, const std::array<uint32_t, 4>& align,
                   const void* bias, bool epilogue_bias, int64_t batch = 1) {
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  if (p->la) cublasLtMatrixLayoutDestroy(p->la);
  if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
  if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
  p->desc = nullptr;
  p->la = p->lb = p->ld = nullptr;
  cublasComputeType_t compute = dtype == kF16 ? CUBLAS_COMPUTE_32F : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                          : CUBLAS_COMPUTE_32F;
  cudaDataType_t dt = dtype == kF16 ? CUDA_R_16F : CUDA_R_32F;
  CheckCublas(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F), op, "cublasLtMatmulDescCreate");
  cublasOperation_t ta = tb ? CUBLAS_OP_T : CUBLAS_OP_N, tn = CUBLAS_OP_N;
  CheckCublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), op,
              "cublasLtMatmulDescSetAttribute(TRANSA)");
  CheckCublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tn, sizeof(tn)), op,
              "cublasLtMatmulDescSetAttribute(TRANSB)");
  if (epilogue_bias) {
    cublasLtEpilogue_t epi = act == 1 ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    CheckCublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), op,
                "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    CheckCublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)), op,
                "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  // cuBLASLt "A" = our b: op(A) is [N, K]; stored column-major as [K, N] (ld K) if transpose_b else [N, K] (ld N)
  if (tb) {
    CheckCublas(cublasLtMatrixLayoutCreate(&p->la, dt, uint64_t(K), uint64_t(N), K), op, "cublasLtMatrixLayoutCreate(A)");
  } else {
    CheckCublas(cublasLtMatrixLayoutCreate(&p->la, dt, uint64_t(N), uint64_t(K), N), op, "cublasLtMatrixLayoutCreate(A)");
  }
  CheckCublas(cublasLtMatrixLayoutCreate(&p->lb, dt, uint64_t(K), uint64_t(M), K), op, "cublasLtMatrixLayoutCreate(B)");
  CheckCublas(cublasLtMatrixLayoutCreate(&p->ld, dt, uint64_t(N), uint64_t(M), N), op, "cublasLtMatrixLayoutCreate(D)");
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
  cublasLtMatmulHeuristicResult_t res[8];
  int n = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, 8, res, &n);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  CheckCublas(st, op, "cublasLtMatmulAlgoGetHeuristic");
  for (int i = 0; i < n; ++i) {
    if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= ws_bytes) {
      p->algo = res[i].algo;
      p->ws_need = res[i].workspaceSize;
      p->epilogue_bias = epilogue_bias;
      return true;
    }
  }
  return false;
}

void Matmul(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  const char* op = kMatmul;
  if (attrs.size() != 3) {
    FailValue(op, "attrs must have 3 entries [transpose_b, activation, allow_tf32], got " +
                      ShapeStr(attrs.data(), int(attrs.size())));
  }
  int64_t tb = attrs[0], act = attrs[1], tf32 = attrs[2];
  if ((tb != 0 && tb != 1) || act < 0 || act > 2 || (tf32 != 0 && tf32 != 1)) {
    FailValue(op, "attrs " + ShapeStr(attrs.data(), 3) +
                      ": transpose_b and allow_tf32 must be 0 or 1, activation 0 (identity), 1 (relu) or 2 (relu6)");
  }
  if (a.device().device_type != kDLCUDA) {
    FailValue(op, "a must be a CUDA tensor, got device type " + std::to_string(a.device().device_type));
  }
  int dev = a.device().device_id;
  int dtype = TensorDType(a);
  if (dtype < 0) FailValue(op, "a has dtype " + DLTypeStr(a.dtype()) + ": only float32 and float16 are supported");
  CheckCudaTensor(op, "a", a, dev);
  CheckCudaTensor(op, "b", b, dev);
  CheckCudaTensor(op, "bias", bias, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckDType(op, "b", b, dtype);
  CheckDType(op, "bias", bias, dtype);
  CheckDType(op, "y", y, dtype);
  if (a.ndim() < 2) FailValue(op, "a must be at least 2-D [..., M, K], got " + ShapeStr(a));
  CheckNdim(op, "b", b, 2);
  CheckNdim(op, "bias", bias, 1);
  Workspace ws = CheckWorkspace(op, workspace, dev);
  int64_t K = a.shape()[a.ndim() - 1];
  int64_t M = a.numel() / std::max<int64_t>(K, 1);
  int64_t N = tb ? b.shape()[0] : b.shape()[1];
  int64_t Kb = tb ? b.shape()[1] : b.shape()[0];
  if (Kb != K) {
    FailValue(op, "a " + ShapeStr(a) + " and b " + ShapeStr(b) + (tb ? " ([N, K], transpose_b=1)" : " ([K, N], transpose_b=0)") +
                      " disagree on K");
  }
  if (bias.shape()[0] != N) FailValue(op, "bias has shape " + ShapeStr(bias) + " but N = " + std::to_string(N));
  bool y_ok = y.ndim() == a.ndim() && y.shape()[y.ndim() - 1] == N;
  for (int i = 0; y_ok && i + 1 < a.ndim(); ++i) y_ok = y.shape()[i] == a.shape()[i];
  if (!y_ok) FailValue(op, "y has shape " + ShapeStr(y) + " but a " + ShapeStr(a) + " and N = " + std::to_string(N) +
                               " give [..., " + std::to_string(N) + "] with a's leading dimensions");
  if (M == 0 || N == 0) return;
  if (K == 0) FailValue(op, "K = 0 is not supported");
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(b)) FailValue(op, "y must not alias a or b");

  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cublasLtHandle_t lt = LtHandle(dev, stream, op);
  std::array<uint32_t, 4> align{PtrAlign(DataPtr(b)), PtrAlign(DataPtr(a)), PtrAlign(DataPtr(y)), PtrAlign(DataPtr(bias))};
  MatmulKey key{dev, dtype, M, N, K, tb, act, tf32, int64_t(ws.bytes), align[0], align[1], align[2], align[3], 0};
  MatmulPlan* p;
  {
    std::lock_guard<std::mutex> lock(MatmulMutex());
    auto& slot = MatmulPlans()[key];
    if (!slot) {
      auto plan = std::make_unique<MatmulPlan>();
      bool ok = TryMatmulPlan(op, lt, plan.get(), dtype, M, N, K, tb, int(act), tf32, ws.bytes, align, DataPtr(bias), true) ||
                TryMatmulPlan(op, lt, plan.get(), dtype, M, N, K, tb, int(act), tf32, ws.bytes, align, DataPtr(bias), false);
      if (!ok) {
        TVM_FFI_THROW(RuntimeError) << op << ": cublasLtMatmulAlgoGetHeuristic found no algorithm (CUBLAS_STATUS_NOT_SUPPORTED) for M="
                                    << M << " N=" << N << " K=" << K << " " << DTypeName(dtype) << " within "
                                    << ws.bytes << " workspace bytes";
      }
      std::ostringstream os;
      os << op << " cuda:" << dev << " " << DTypeName(dtype) << " M=" << M << " N=" << N << " K=" << K
         << " attrs=" << ShapeStr(attrs.data(), 3) << " workspace=" << ws.bytes << " -> epilogue="
         << (plan->epilogue_bias ? (act == 1 ? "relu_bias" : "bias") : "none") << (act == 2 || !plan->epilogue_bias ? "+kernel" : "")
         << " needs=" << plan->ws_need;
      plan->desc_str = os.str();
      slot = std::move(plan);
    }
    p = slot.get();
  }
  std::lock_guard<std::mutex> lock(p->mu);
  if (p->epilogue_bias) {
    const void* bp = DataPtr(bias);
    CheckCublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)), op,
                "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  const float one = 1.0f, zero = 0.0f;
  void* yp = DataPtr(y);
  CheckCublas(cublasLtMatmul(lt, p->desc, &one, DataPtr(b), p->la, DataPtr(a), p->lb, &zero, yp, p->ld, yp, p->ld,
                             &p->algo, ws.ptr, ws.bytes, stream),
              op, "cublasLtMatmul", "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  if (!p->epilogue_bias) {
    LaunchBiasAct(op, dtype, yp, DataPtr(bias), nullptr, M * N, 1, N, int(act), stream);
  } else if (act == 2) {
    LaunchBiasAct(op, dtype, yp, nullptr, nullptr, M * N, 1, N, 2, stream);
  }
}


void BatchedMatmul(TensorView a, TensorView b, Shape attrs, TensorView y, TensorView workspace) {
  const char* op = kBatchedMatmul;
  if (attrs.size() != 2) {
    FailValue(op, "attrs must have 2 entries [transpose_b, allow_tf32], got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  int64_t tb = attrs[0], tf32 = attrs[1];
  if ((tb != 0 && tb != 1) || (tf32 != 0 && tf32 != 1)) {
    FailValue(op, "attrs " + ShapeStr(attrs.data(), 2) + ": transpose_b and allow_tf32 must be 0 or 1");
  }
  if (a.device().device_type != kDLCUDA) {
    FailValue(op, "a must be a CUDA tensor, got device type " + std::to_string(a.device().device_type));
  }
  int dev = a.device().device_id;
  int dtype = TensorDType(a);
  if (dtype < 0) FailValue(op, "a has dtype " + DLTypeStr(a.dtype()) + ": only float32 and float16 are supported");
  CheckCudaTensor(op, "a", a, dev);
  CheckCudaTensor(op, "b", b, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckDType(op, "b", b, dtype);
  CheckDType(op, "y", y, dtype);
  int nd = a.ndim();
  if (nd < 3 || b.ndim() != nd || y.ndim() != nd) {
    FailValue(op, "a, b and y must have the same rank >= 3 [..., rows, cols], got a " + ShapeStr(a) + ", b " + ShapeStr(b) +
                      ", y " + ShapeStr(y));
  }
  int64_t batch = 1;
  for (int i = 0; i + 2 < nd; ++i) {
    if (b.shape()[i] != a.shape()[i] || y.shape()[i] != a.shape()[i]) {
      FailValue(op, "a " + ShapeStr(a) + ", b " + ShapeStr(b) + " and y " + ShapeStr(y) +
                        " must have the same leading (batch) dimensions");
    }
    batch *= a.shape()[i];
  }
  Workspace ws = CheckWorkspace(op, workspace, dev);
  int64_t M = a.shape()[nd - 2], K = a.shape()[nd - 1];
  int64_t N = tb ? b.shape()[nd - 2] : b.shape()[nd - 1];
  int64_t Kb = tb ? b.shape()[nd - 1] : b.shape()[nd - 2];
  if (Kb != K) FailValue(op, "a " + ShapeStr(a) + " and b " + ShapeStr(b) + " disagree on K");
  if (y.shape()[nd - 2] != M || y.shape()[nd - 1] != N) {
    FailValue(op, "y has shape " + ShapeStr(y) + " but a @ op(b) gives [..., " + std::to_string(M) + ", " +
                      std::to_string(N) + "]");
  }
  if (batch == 0 || M == 0 || N == 0) return;
  if (K == 0) FailValue(op, "K = 0 is not supported");
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(b)) FailValue(op, "y must not alias a or b");

  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cublasLtHandle_t lt = LtHandle(dev, stream, op);
  std::array<uint32_t, 4> align{PtrAlign(DataPtr(b)), PtrAlign(DataPtr(a)), PtrAlign(DataPtr(y)), 0};
  MatmulKey key{dev, dtype, M, N, K, tb, 0, tf32, int64_t(ws.bytes), align[0], align[1], align[2], 0, batch};
  MatmulPlan* p;
  {
    std::lock_guard<std::mutex> lock(MatmulMutex());
    auto& slot = MatmulPlans()[key];
    if (!slot) {
      auto plan = std::make_unique<MatmulPlan>();
      if (!TryMatmulPlan(op, lt, plan.get(), dtype, M, N, K, tb, 0, tf32, ws.bytes, align, nullptr, false, batch)) {
        TVM_FFI_THROW(RuntimeError) << op << ": cublasLtMatmulAlgoGetHeuristic found no algorithm for batch=" << batch
                                    << " M=" << M << " N=" << N << " K=" << K << " " << DTypeName(dtype) << " within "
                                    << ws.bytes << " workspace bytes";
      }
      std::ostringstream os;
      os << op << " cuda:" << dev << " " << DTypeName(dtype) << " batch=" << batch << " M=" << M << " N=" << N
         << " K=" << K << " attrs=" << ShapeStr(attrs.data(), 2) << " workspace=" << ws.bytes << " needs=" << plan->ws_need;
      plan->desc_str = os.str();
      slot = std::move(plan);
    }
    p = slot.get();
  }
  std::lock_guard<std::mutex> lock(p->mu);
  const float one = 1.0f, zero = 0.0f;
  void* yp = DataPtr(y);
  CheckCublas(cublasLtMatmul(lt, p->desc, &one, DataPtr(b), p->la, DataPtr(a), p->lb, &zero, yp, p->ld, yp, p->ld,
                             &p->algo, ws.ptr, ws.bytes, stream),
              op, "cublasLtMatmul", "batch=" + std::to_string(batch) + " M=" + std::to_string(M) + " N=" +
                                        std::to_string(N) + " K=" + std::to_string(K));
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
  }
  {
    std::lock_guard<std::mutex> lock(MatmulMutex());
    for (auto& kv : MatmulPlans()) out.push_back(String(kv.second->desc_str));
  }
  return out;
}

template <typename F>
void Register(const char* name, F&& f) {
  tvm::ffi::Function fn = tvm::ffi::Function::FromTyped(std::forward<F>(f), std::string(name));
  TVMFFIByteArray n{name, std::char_traits<char>::length(name)};
  TVMFFIAny any = tvm::ffi::AnyView(fn).CopyToTVMFFIAny();
  // allow_override: a second build of this extension loaded into the same process replaces the first
  if (TVMFFIFunctionSetGlobal(&n, any.v_obj, 1) != 0) {
    std::fprintf(stderr, "tvm-nimble vendor extension: cannot register %s\n", name);
  }
}

__attribute__((constructor)) void RegisterAll() {
  try {
    Register(kConv, Conv2d);
    Register(kConvAdd, Conv2dAdd);
    Register(kMatmul, Matmul);
    Register(kBatchedMatmul, BatchedMatmul);
    Register("nimble.cudnn.conv2d_algos", Conv2dAlgos);
    Register("nimble.vendor.versions", Versions);
    Register("nimble.vendor.plans", Plans);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
