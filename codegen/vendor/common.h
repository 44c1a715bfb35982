// Helpers every translation unit of the vendor extension shares: argument checks with one-line
// errors, the workspace, device and stream handling, float conversions and registration.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <utility>

namespace nimble_vendor {

// Microseconds per call of `call` (it enqueues one call on `stream` and returns false if that failed): two
// warm-up calls, then `reps` back to back queued behind a kernel that waits on the GPU, so that the sequence measures
// GPU time, not the host's enqueue rate; -1 if a call or the timing failed. It synchronizes, so it must not run
// inside a graph capture. Defined in small_kernels.cu (with its kernel: a unit that calls it links that unit).
double GpuUsPerCall(cudaStream_t stream, int64_t reps, const std::function<bool()>& call);

namespace {

using tvm::ffi::Array;
using tvm::ffi::Shape;
using tvm::ffi::String;
using tvm::ffi::TensorView;

constexpr int64_t kWorkspaceAlign = 256;

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
// what a dtype error lists
constexpr const char* kDTypesTaken = "only float32, float16 and bfloat16 are supported";

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

const char* DTypeName(int d) { return d == kF32 ? "float32" : d == kF16 ? "float16" : "bfloat16"; }

// A dtype name as the Python side spells it (kF32 / kF16 / kBF16), -1 for anything else.
int DTypeFromName(const std::string& name) {
  return name == "float32" ? kF32 : name == "float16" ? kF16 : name == "bfloat16" ? kBF16 : -1;
}

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
  if (d.code == kDLBfloat && d.lanes == 1 && d.bits == 16) return kBF16;
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

// The GEMMs' epilogue activations (Activate, below), as attrs spell them.
constexpr int kMaxActivation = 4;
constexpr const char* kActivations = "0 (none), 1 (relu), 2 (relu6), 3 (gelu) or 4 (gelu, tanh approximation)";

// A GEMM's result y of M rows of N: M * N elements, its last dimension N, any leading dimensions (a reshape of the
// rows is free). `operands` names what gives M and N, for the message.
void CheckRows(const char* op, const TensorView& y, int64_t M, int64_t N, const std::string& operands) {
  if (y.ndim() < 1 || y.shape()[y.ndim() - 1] != N || y.numel() != M * N) {
    FailValue(op, "y has shape " + ShapeStr(y) + " but " + operands + " give " + std::to_string(M) + " rows of " +
                      std::to_string(N));
  }
}

// The dtype a GEMM computing in `dtype` writes: y's, `dtype` or float32 (a 16-bit GEMM feeding a float32 residual
// stream, rounded once); the bias is in y's dtype (cuBLASLt's rule, kept by our kernels).
int GemmOutDType(const char* op, int dtype, const TensorView& y, const TensorView& bias) {
  const int out = TensorDType(y) == kF32 ? kF32 : dtype;
  CheckDType(op, "y", y, out);
  CheckDType(op, "bias", bias, out);
  return out;
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


#ifdef __CUDACC__  // device code, for the .cu units (the host-only .cpp units are compiled without nvcc's device pass)
// 16 bytes global -> shared without a register round trip (sm_80+), zero-filled when not `valid` (nothing read);
// a group of them committed, then waited for until at most N groups are in flight (gemm_simt, attention_cluster)
__device__ __forceinline__ void CpAsync16(float* smem, const float* gmem, bool valid) {
  const unsigned dst = unsigned(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <typename T>
__device__ __forceinline__ float ToF(T v) { return static_cast<float>(v); }
template <>
__device__ __forceinline__ float ToF<__half>(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T FromF(float v) { return static_cast<T>(v); }
template <>
__device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ float ToF<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The 16 / sizeof(T) elements of 16 bytes as floats
template <typename T>
__device__ __forceinline__ void Unpack16B(const uint4& raw, float* f) {
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < int(16 / sizeof(T)); ++i) f[i] = ToF(h[i]);
}

// The epilogue activations every kernel here shares: 0 identity, 1 relu, 2 relu6, 3 GELU (the erf form), 4 GELU (the
// tanh approximation, as cuBLASLt's GELU epilogue and GPT-2's gelu_new compute it). A kernel whose main loop is
// tight on registers compiles only the codes up to kMaxAct: the code of a branch it never takes still shapes its
// register allocation (see the SIMT GEMM's kSimtMaxActivation).
template <int kMaxAct = kMaxActivation>
__device__ __forceinline__ float Activate(float v, int act) {
  if (act == 1) return fmaxf(v, 0.0f);
  if (act == 2) return fminf(fmaxf(v, 0.0f), 6.0f);
  if (act == 3) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  if constexpr (kMaxAct >= 4) {
    if (act == 4) return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
  }
  return v;
}

// Programmatic dependent launch (sm_90+). A kernel launched with KernelLaunch::Pdl() may start while the kernel
// before it in the stream still runs. Before GridDependencyWait() it may read only what no kernel writes (a layer's
// weights: a GEMV issues its first weight loads there); after it, the kernels before it in the stream have finished
// and their writes are visible, so every read of an activation and every write comes after it. A kernel calls
// GridLaunchDependents() once the next kernel may take its place beside it (its own blocks all resident). Both are
// no-ops for a kernel launched without the attribute, and compile to nothing before sm_90.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void GridLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

#endif  // __CUDACC__

// An attribute of the current device, asked of the driver once per device (a launch may be under stream capture);
// `fallback` where the driver gives none (or for a device index past 63).
template <cudaDeviceAttr A>
int DeviceAttribute(int fallback) {
  static std::atomic<int> values[64] = {};
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= 64) return fallback;
  int v = values[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int a = 0;
    cudaDeviceGetAttribute(&a, A, dev);
    v = a > 0 ? a : fallback;
    values[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

int SmCount() { return DeviceAttribute<cudaDevAttrMultiProcessorCount>(132); }

// `set()` (a CUDA call returning cudaError_t: a kernel's function attributes) once per device: `done` holds a bit per
// device it succeeded on
template <typename F>
cudaError_t OncePerDevice(std::atomic<uint64_t>& done, F&& set) {
  int dev = 0;
  cudaGetDevice(&dev);
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t(1) << dev : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  const cudaError_t err = set();
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

// Whether launches ask for programmatic dependent launch: on sm_90+ unless NIMBLE_PDL=0 (the A/B switch of the
// decode benchmarks; read once a process)
bool PdlEnabled() {
  static const bool wanted = [] {
    const char* env = std::getenv("NIMBLE_PDL");
    return env == nullptr || std::string(env) != "0";
  }();
  return wanted && DeviceAttribute<cudaDevAttrComputeCapabilityMajor>(0) >= 9;
}

// One kernel launch through cudaLaunchKernelEx: grid, block, dynamic shared memory and stream, with the attributes
// asked for -- a thread-block cluster of `x` x `y` x `z` blocks, programmatic dependent launch (see
// GridDependencyWait; asked only where PdlEnabled()).
//   KernelLaunch(grid, block, stream).Cluster(c).Pdl()(Kernel<...>, args...)
class KernelLaunch {
 public:
  KernelLaunch(dim3 grid, dim3 block, cudaStream_t stream, size_t smem = 0) {
    cfg_.gridDim = grid;
    cfg_.blockDim = block;
    cfg_.dynamicSmemBytes = smem;
    cfg_.stream = stream;
  }
  KernelLaunch& Cluster(unsigned x, unsigned y = 1, unsigned z = 1) {
    if (x * y * z > 1) {
      cudaLaunchAttribute& a = attrs_[n_++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = x, a.val.clusterDim.y = y, a.val.clusterDim.z = z;
    }
    return *this;
  }
  KernelLaunch& Pdl() {
    if (PdlEnabled()) {
      cudaLaunchAttribute& a = attrs_[n_++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    return *this;
  }
  template <typename... Params, typename... Args>
  cudaError_t operator()(void (*kernel)(Params...), Args&&... args) {
    cfg_.attrs = attrs_;
    cfg_.numAttrs = unsigned(n_);
    return cudaLaunchKernelEx(&cfg_, kernel, std::forward<Args>(args)...);
  }

 private:
  cudaLaunchConfig_t cfg_ = {};
  cudaLaunchAttribute attrs_[2] = {};
  int n_ = 0;
};

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

}  // namespace
}  // namespace nimble_vendor
