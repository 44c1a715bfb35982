// cuDNN and cuBLASLt status checks and handles (one per device and stream), shared by the translation
// units that call cuDNN or cuBLASLt (nimble_vendor.cpp, cudnn_attention.cpp).
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "common.h"

namespace nimble_vendor {
namespace {

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

}  // namespace
}  // namespace nimble_vendor
