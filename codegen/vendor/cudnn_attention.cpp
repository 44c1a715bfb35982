// cuDNN's fused attention (SDPA through the cuDNN frontend's graph API) for fp16 and bf16:
//
//   nimble.attention.cudnn_sdpa(q, k, v, attrs, y, workspace)
//       y = softmax(scale * q·kᵀ) · v, the attrs and strided views of nimble.attention.sdpa
//       (attention.cu; no bias: a padding mask takes our kernel), float16 or bfloat16 in and out.
//
// The operation graph and its execution plan are built on the first call of a configuration (the
// executor's live run before capture) and cached; a call then only executes the plan on the current
// stream, with the caller's workspace. A configuration cuDNN does not support fails that first call
// with one line; the provider only emits calls cuDNN's SDPA documents (head dimension a multiple of 8
// up to 128, strides and offsets multiples of 8 elements).
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common.h"
#include "cudnn_frontend_handle.h"
#include "handles.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

namespace fe = cudnn_frontend;

constexpr const char* kCudnnSdpa = "nimble.attention.cudnn_sdpa";
enum : int64_t { kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4 };

struct SdpaGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::mutex mu;
};

using SdpaKey = std::array<int64_t, 2 + kNumAttrs + 4>;  // device, dtype, attrs, alignments of q, k, v, y

std::mutex& GraphsMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::map<SdpaKey, std::unique_ptr<SdpaGraph>>& Graphs() {
  static auto* m = new std::map<SdpaKey, std::unique_ptr<SdpaGraph>>();
  return *m;
}

void CheckFe(fe::error_t err, const char* what) {
  if (err.is_bad()) {
    TVM_FFI_THROW(RuntimeError) << kCudnnSdpa << ": " << what << " failed: " << OneLine(err.get_message());
  }
}

std::unique_ptr<SdpaGraph> BuildGraph(const SdpaParams& p, int dtype, cudnnHandle_t handle) {
  auto g = std::make_unique<SdpaGraph>();
  g->graph = std::make_shared<fe::graph::Graph>();
  auto& graph = *g->graph;
  graph.set_io_data_type(dtype == kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, int64_t S, int64_t D, int64_t sb, int64_t sh, int64_t ss) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({p.B, p.H, S, D})
                            .set_stride({sb, sh, ss, 1}));
  };
  auto q = tensor("Q", kUidQ, p.Sq, p.D, p.q_sb, p.q_sh, p.q_ss);
  auto k = tensor("K", kUidK, p.Sk, p.D, p.k_sb, p.k_sh, p.k_ss);
  auto v = tensor("V", kUidV, p.Sk, p.Dv, p.v_sb, p.v_sh, p.v_ss);
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(false).set_attn_scale(p.scale);
  auto outputs = graph.sdpa(q, k, v, options);
  outputs[0]->set_output(true).set_uid(kUidO).set_dim({p.B, p.H, p.Sq, p.Dv}).set_stride({p.o_sb, p.o_sh, p.o_ss, 1});
  CheckFe(graph.validate(), "validate");
  CheckFe(graph.build_operation_graph(handle), "build_operation_graph");
  CheckFe(graph.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  CheckFe(graph.check_support(handle), "check_support");
  CheckFe(graph.build_plans(handle), "build_plans");
  CheckFe(graph.get_workspace_size(g->workspace), "get_workspace_size");
  return g;
}

void CudnnSdpa(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  const char* op = kCudnnSdpa;
  int dtype = 0;
  const SdpaParams p = CheckSdpa(op, q, k, v, nullptr, attrs, y, workspace, &dtype);
  if (dtype == kF32) FailValue(op, "cuDNN's fused attention is fp16/bf16 here; float32 takes nimble.attention.sdpa");
  if (p.group != 1) FailValue(op, "grouped K/V heads (a group over 1) take nimble.attention.sdpa here");
  const int dev = q.device().device_id;
  Workspace ws = CheckWorkspace(op, workspace, dev);
  // both 16-bit dtypes: the offsets count 2-byte elements
  const void* qp = static_cast<const __half*>(DataPtr(q)) + p.q_off;
  const void* kp = static_cast<const __half*>(DataPtr(k)) + p.k_off;
  const void* vp = static_cast<const __half*>(DataPtr(v)) + p.v_off;
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cudnnHandle_t handle = CudnnHandle(dev, stream, op);
  SdpaKey key{};
  key[0] = dev;
  key[1] = dtype;
  for (int i = 0; i < int(attrs.size()); ++i) key[2 + i] = attrs[i];  // 26 or 27 (CheckSdpa)
  key[2 + kNumAttrs] = PtrAlign(qp), key[3 + kNumAttrs] = PtrAlign(kp), key[4 + kNumAttrs] = PtrAlign(vp);
  key[5 + kNumAttrs] = PtrAlign(DataPtr(y));
  SdpaGraph* g;
  {
    std::lock_guard<std::mutex> lock(GraphsMutex());
    auto& slot = Graphs()[key];
    if (!slot) slot = BuildGraph(p, dtype, handle);
    g = slot.get();
  }
  if (g->workspace > int64_t(ws.bytes)) {
    FailValue(op, "cuDNN's plan needs " + std::to_string(g->workspace) + " workspace bytes but the workspace holds " +
                      std::to_string(ws.bytes));
  }
  std::unordered_map<int64_t, void*> pack{{kUidQ, const_cast<void*>(qp)}, {kUidK, const_cast<void*>(kp)},
                                          {kUidV, const_cast<void*>(vp)}, {kUidO, DataPtr(y)}};
  std::lock_guard<std::mutex> lock(g->mu);
  CheckFe(g->graph->execute(handle, pack, ws.ptr), "execute");
}

__attribute__((constructor)) void RegisterCudnnAttention() {
  try {
    Register(kCudnnSdpa, CudnnSdpa);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
