// cuDNN's fused attention (SDPA through the cuDNN frontend's graph API) for fp16 and bf16:
//
//   nimble.attention.cudnn_sdpa(q, k, v, attrs, y, workspace)
//       y = softmax(scale * q·kᵀ) · v, the attrs and strided views of nimble.attention.sdpa
//       (attention.cu), float16 or bfloat16 in and out.
//   nimble.attention.cudnn_bias_sdpa(q, k, v, bias, attrs, y, workspace)
//       y = softmax(scale * q·kᵀ + bias) · v: a decoder's causal + padding mask (float32, or q's dtype) read
//       through the attrs' mask strides, and grouped K/V heads (the attrs' group: query head h reads K/V head
//       h / group) read once per KV head. cuDNN reads an fp32 bias whose rows are contiguous as it is; any other
//       mask is first written into the workspace (past cuDNN's own) as a contiguous 16-bit tensor, clamped to the
//       dtype's finite range (LaunchSdpaBiasToHalf, small_kernels.cu), so that a fully masked row stays finite.
//       NIMBLE_CUDNN_BIAS_CONVERT=1 converts every mask (attention_check checks both ways).
//   nimble.attention.cudnn_bias_causal_sdpa(q, k, v, bias, attrs, y, workspace)
//       the same with cuDNN's causal mask on top (key j > query i), for a mask that masks those keys already (the
//       provider proves it from the model): cuDNN skips the tiles above the diagonal. Where cuDNN refuses the causal
//       mask beside the bias, the call runs without it (the bias alone gives the same result).
//   nimble.attention.cudnn_key_causal_sdpa(q, k, v, bias, attrs, y, workspace)
//       y = softmax(scale * q·kᵀ + bias + causal) · v: cuDNN's causal mask (key j > query i) is part of the
//       function, not an optimization: the bias is a decoder's padding mask alone, one row of keys broadcast over
//       the query rows (mask stride along the queries 0), which cuDNN reads as a [Bm, Hm, 1, Sk] tensor instead of
//       a whole [Sq, Sk] plane per head. Where cuDNN refuses the causal mask the call fails with one line.
//
// A mask broadcast over the query rows (stride 0: BERT's padding mask, the key mask above) is handed to cuDNN as
// one row that it broadcasts, where it is fp32 with contiguous keys; only other masks are converted.
//
// The operation graph and its execution plan are built on the first call of a configuration (the
// executor's live run before capture) and cached; a call then only executes the plan on the current
// stream, with the caller's workspace. A configuration cuDNN does not support fails that first call
// with one line (an fp32 bias cuDNN refuses is converted instead); the provider only emits calls cuDNN's
// SDPA documents (head dimension a multiple of 8 up to 128, strides and offsets multiples of 8 elements).
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "cudnn_frontend_handle.h"
#include "handles.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

namespace fe = cudnn_frontend;

constexpr const char* kCudnnSdpa = "nimble.attention.cudnn_sdpa";
constexpr const char* kCudnnBiasSdpa = "nimble.attention.cudnn_bias_sdpa";
constexpr const char* kCudnnBiasCausalSdpa = "nimble.attention.cudnn_bias_causal_sdpa";
constexpr const char* kCudnnKeyCausalSdpa = "nimble.attention.cudnn_key_causal_sdpa";
enum : int64_t { kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidBias = 5 };

// How a call hands its mask to cuDNN: none, the caller's fp32 tensor as it is, or converted into the workspace
enum BiasMode : int64_t { kNoBias = 0, kBiasAsIs = 1, kBiasConverted = 2 };

struct SdpaGraph {
  std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN refused the configuration (kBiasAsIs: convert instead)
  int64_t workspace = 0;
  std::mutex mu;
};

// device, dtype, attrs, alignments of q, k, v, y and the bias, the bias mode, causal
using SdpaKey = std::array<int64_t, 2 + kNumAttrs + 7>;

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

std::unique_ptr<SdpaGraph> BuildGraph(const SdpaParams& p, int dtype, BiasMode bias, bool causal,
                                      cudnnHandle_t handle) {
  auto g = std::make_unique<SdpaGraph>();
  g->graph = std::make_shared<fe::graph::Graph>();
  auto& graph = *g->graph;
  graph.set_io_data_type(dtype == kBF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, int64_t H, int64_t S, int64_t D, int64_t sb, int64_t sh,
                    int64_t ss) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({p.B, H, S, D})
                            .set_stride({sb, sh, ss, 1}));
  };
  const int64_t kv_heads = p.H / p.group;  // grouped-query attention: cuDNN reads each KV head for its group
  auto q = tensor("Q", kUidQ, p.H, p.Sq, p.D, p.q_sb, p.q_sh, p.q_ss);
  auto k = tensor("K", kUidK, kv_heads, p.Sk, p.D, p.k_sb, p.k_sh, p.k_ss);
  auto v = tensor("V", kUidV, kv_heads, p.Sk, p.Dv, p.v_sb, p.v_sh, p.v_ss);
  auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(false).set_attn_scale(p.scale);
  if (bias != kNoBias) {
    const int64_t Bm = p.m_sb ? p.B : 1, Hm = p.m_sh ? p.H : 1;
    auto attrs = fe::graph::Tensor_attributes().set_name("bias").set_uid(kUidBias);
    if (bias == kBiasAsIs) {  // the caller's fp32 mask, its rows contiguous (BiasAsIs); a size-1 dim packed, and
      // a mask broadcast over the query rows one row of keys, which cuDNN broadcasts
      const int64_t Sqm = p.m_sq ? p.Sq : 1, sq = p.m_sq ? p.m_sq : p.Sk;
      const int64_t sh = Hm == 1 ? Sqm * sq : p.m_sh, sb = Bm == 1 ? Hm * sh : p.m_sb;
      attrs.set_dim({Bm, Hm, Sqm, p.Sk}).set_stride({sb, sh, sq, 1}).set_data_type(fe::DataType_t::FLOAT);
    } else {  // the converted copy: contiguous, of q's dtype
      attrs.set_dim({Bm, Hm, p.Sq, p.Sk}).set_stride({Hm * p.Sq * p.Sk, p.Sq * p.Sk, p.Sk, 1});
    }
    auto b = graph.tensor(attrs);
    options.set_bias(b);
  }
  if (causal) options.set_causal_mask(true);
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

// cuDNN reads an fp32 mask as it is when its rows are contiguous (and 16-byte aligned), whole rows apart or one row
// broadcast over the queries; anything else is converted (as is every mask under NIMBLE_CUDNN_BIAS_CONVERT=1)
bool BiasAsIs(const SdpaParams& p, int mask_dtype, const void* m) {
  const char* env = std::getenv("NIMBLE_CUDNN_BIAS_CONVERT");
  if (env != nullptr && env[0] == '1') return false;
  return mask_dtype == kF32 && p.m_sk == 1 && (p.m_sq >= p.Sk || (p.m_sq == 0 && p.Sk % 4 == 0)) &&
         p.m_sq % 4 == 0 && p.m_sh % 4 == 0 && p.m_sb % 4 == 0 && PtrAlign(m) >= 16;
}

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// causal: cuDNN's causal mask where it takes it beside the bias (else the call runs without it); causal_only: the
// causal mask is part of the call (cudnn_key_causal_sdpa), never left out
void Run(const char* op, TensorView q, TensorView k, TensorView v, const TensorView* bias, bool causal, Shape attrs,
         TensorView y, TensorView workspace, bool causal_only = false) {
  int dtype = 0;
  const SdpaParams p = CheckSdpa(op, q, k, v, bias, attrs, y, workspace, &dtype);
  if (dtype == kF32) FailValue(op, "cuDNN's fused attention is fp16/bf16 here; float32 takes nimble.attention.sdpa");
  if (!bias && p.group != 1) FailValue(op, "grouped K/V heads (a group over 1) take nimble.attention.cudnn_bias_sdpa");
  const int dev = q.device().device_id;
  Workspace ws = CheckWorkspace(op, workspace, dev);
  // both 16-bit dtypes: the offsets count 2-byte elements
  const void* qp = static_cast<const __half*>(DataPtr(q)) + p.q_off;
  const void* kp = static_cast<const __half*>(DataPtr(k)) + p.k_off;
  const void* vp = static_cast<const __half*>(DataPtr(v)) + p.v_off;
  const int mask_dtype = bias ? TensorDType(*bias) : -1;
  const void* mp = bias ? DataPtr(*bias) : nullptr;
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  cudnnHandle_t handle = CudnnHandle(dev, stream, op);
  BiasMode mode = !bias ? kNoBias : BiasAsIs(p, mask_dtype, mp) ? kBiasAsIs : kBiasConverted;
  auto key_of = [&](BiasMode m, bool c) {
    SdpaKey key{};
    key[0] = dev;
    key[1] = dtype;
    for (int i = 0; i < int(attrs.size()); ++i) key[2 + i] = attrs[i];  // 26 or 27 (CheckSdpa)
    key[2 + kNumAttrs] = PtrAlign(qp), key[3 + kNumAttrs] = PtrAlign(kp), key[4 + kNumAttrs] = PtrAlign(vp);
    key[5 + kNumAttrs] = PtrAlign(DataPtr(y));
    key[6 + kNumAttrs] = m == kBiasAsIs ? PtrAlign(mp) : 0;
    key[7 + kNumAttrs] = m;
    key[8 + kNumAttrs] = c;
    return key;
  };
  // the configurations in order of preference, the last the one without a fallback: with the causal mask (where
  // asked) before without it, the fp32 bias as it is before converted; a refusal is remembered
  std::vector<std::pair<BiasMode, bool>> tries;
  for (bool c : causal_only ? std::vector<bool>{true} : causal ? std::vector<bool>{true, false}
                                                                 : std::vector<bool>{false}) {
    if (mode == kBiasAsIs) tries.push_back({kBiasAsIs, c});
    tries.push_back({mode == kNoBias ? kNoBias : kBiasConverted, c});
  }
  SdpaGraph* g = nullptr;
  {
    std::lock_guard<std::mutex> lock(GraphsMutex());
    for (size_t i = 0; i + 1 < tries.size() && g == nullptr; ++i) {
      auto& slot = Graphs()[key_of(tries[i].first, tries[i].second)];
      if (!slot) {
        try {
          slot = BuildGraph(p, dtype, tries[i].first, tries[i].second, handle);
        } catch (const std::exception&) {  // cuDNN refuses this one: remembered, the next one tried
          slot = std::make_unique<SdpaGraph>();
        }
      }
      if (slot->graph) g = slot.get(), mode = tries[i].first;
    }
    if (g == nullptr) {
      mode = tries.back().first;
      auto& chosen = Graphs()[key_of(mode, tries.back().second)];
      if (!chosen || !chosen->graph) chosen = BuildGraph(p, dtype, mode, tries.back().second, handle);
      g = chosen.get();
    }
  }
  const int64_t bias_at = RoundUp(g->workspace, 256);
  const int64_t bias_bytes = mode == kBiasConverted ? (p.m_sb ? p.B : 1) * (p.m_sh ? p.H : 1) * p.Sq * p.Sk * 2 : 0;
  if (bias_at + bias_bytes > int64_t(ws.bytes)) {
    FailValue(op, "cuDNN's plan needs " + std::to_string(g->workspace) + " workspace bytes" +
                      (bias_bytes ? " and the converted mask " + std::to_string(bias_bytes) : std::string()) +
                      " but the workspace holds " + std::to_string(ws.bytes));
  }
  std::unordered_map<int64_t, void*> pack{{kUidQ, const_cast<void*>(qp)}, {kUidK, const_cast<void*>(kp)},
                                          {kUidV, const_cast<void*>(vp)}, {kUidO, DataPtr(y)}};
  if (mode == kBiasAsIs) pack[kUidBias] = const_cast<void*>(mp);
  if (mode == kBiasConverted) {
    void* converted = static_cast<char*>(ws.ptr) + bias_at;
    LaunchSdpaBiasToHalf(op, p, mask_dtype, mp, dtype, converted, stream);
    pack[kUidBias] = converted;
  }
  std::lock_guard<std::mutex> lock(g->mu);
  CheckFe(g->graph->execute(handle, pack, ws.ptr), "execute");
}

void CudnnSdpa(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  Run(kCudnnSdpa, q, k, v, nullptr, false, attrs, y, workspace);
}

void CudnnBiasSdpa(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
                   TensorView workspace) {
  Run(kCudnnBiasSdpa, q, k, v, &bias, false, attrs, y, workspace);
}

void CudnnBiasCausalSdpa(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
                         TensorView workspace) {
  Run(kCudnnBiasCausalSdpa, q, k, v, &bias, true, attrs, y, workspace);
}

void CudnnKeyCausalSdpa(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
                        TensorView workspace) {
  Run(kCudnnKeyCausalSdpa, q, k, v, &bias, true, attrs, y, workspace, /*causal_only=*/true);
}

__attribute__((constructor)) void RegisterCudnnAttention() {
  try {
    Register(kCudnnSdpa, CudnnSdpa);
    Register(kCudnnBiasSdpa, CudnnBiasSdpa);
    Register(kCudnnBiasCausalSdpa, CudnnBiasCausalSdpa);
    Register(kCudnnKeyCausalSdpa, CudnnKeyCausalSdpa);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
