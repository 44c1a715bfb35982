// Convolutions through the cuDNN frontend's graph API (provider cudnn_graph):
//
//   nimble.cudnn_graph.conv2d(x, w, b, attrs, y, workspace)         y = act(conv2d(x, w) + b)
//   nimble.cudnn_graph.conv2d_add(x, w, b, z, attrs, y, workspace)  y = act(conv2d(x, w) + b + z)
//
// the arguments and attrs of nimble.cudnn.conv2d / conv2d_add (conv_args.h; the algo entry must be -1), groups 1,
// in either layout (NCHW / OIHW, or NHWC / OHWI: the same dims with channels-last strides).
// Unlike the legacy call, z must not be y: a graph's convolution cannot accumulate into its output as the legacy
// API's beta does (the memory plan never gives a launch's output the memory of a tensor that launch reads).
//
// Why a second path to cuDNN: the legacy API's algorithm list (cudnnGetConvolutionForwardAlgorithm_v7, what
// nimble.cudnn.* choose from) does not reach cuDNN 9's faster engines: TF32 convolutions ran at their fp32 speed
// through it, while PyTorch's, through these engine heuristics, got tensor-core kernels without measuring (see
// benchmarks/findings.md, 'Our fp32 GEMM for transformers, build times, precision rows of the chains').
//
// A configuration's graph is built on its first call and cached: conv_fprop, then the bias and residual adds and
// the ReLU as pointwise nodes in fp32 when cuDNN has an engine for that fused graph; else the convolution
// alone, followed by our bias/activation kernel (relu6 always goes that way). The engine is cuDNN's heuristic
// (mode A) first among those that fit the workspace; fp32 without TF32 deselects tensor-core engines.
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common.h"
#include "conv_args.h"
#include "cudnn_frontend_handle.h"
#include "handles.h"

namespace nimble_vendor {
namespace {

namespace fe = cudnn_frontend;

constexpr const char* kGraphConv = "nimble.cudnn_graph.conv2d";
constexpr const char* kGraphConvAdd = "nimble.cudnn_graph.conv2d_add";
enum : int64_t { kUidX = 1, kUidW = 2, kUidB = 3, kUidZ = 4, kUidY = 5 };

struct ConvGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  bool fused = false;  // bias, residual and ReLU are in the graph (else our kernel after it)
  int64_t workspace = 0;
  std::mutex mu;
};

// device, dtype, residual, x and w shapes, attrs (the layout included), workspace bytes
using GraphKey = std::array<int64_t, 3 + 8 + 11 + 1>;

std::mutex& ConvGraphsMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::map<GraphKey, std::unique_ptr<ConvGraph>>& ConvGraphs() {
  static auto* m = new std::map<GraphKey, std::unique_ptr<ConvGraph>>();
  return *m;
}

fe::DataType_t FeType(int dtype) {
  return dtype == kF32 ? fe::DataType_t::FLOAT : dtype == kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16;
}

// the strides of a packed tensor of dims [N,C,H,W] (or [O,C,KH,KW]) in layout 0 (NCHW) or 1 (NHWC / OHWI)
std::vector<int64_t> Packed(const std::array<int64_t, 4>& d, int64_t layout) {
  if (layout == 1) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// The graph for `call`, fused (bias, residual and ReLU as pointwise nodes) or the convolution alone; an error
// (cuDNN has no engine for it within the workspace) comes back as the frontend's error.
fe::error_t TryBuild(const ConvCall& call, bool residual, bool fused, cudnnHandle_t handle, ConvGraph* out) {
  const ConvAttrs& a = call.a;
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(FeType(call.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, const std::array<int64_t, 4>& d) {
    return graph->tensor(fe::graph::Tensor_attributes()
                             .set_name(name)
                             .set_uid(uid)
                             .set_dim({d[0], d[1], d[2], d[3]})
                             .set_stride(Packed(d, a.layout)));
  };
  auto x = tensor("X", kUidX, call.xs);
  auto w = tensor("W", kUidW, call.wsh);
  auto conv = fe::graph::Conv_fprop_attributes()
                  .set_name("conv")
                  .set_padding({a.pad_h, a.pad_w})
                  .set_stride({a.stride_h, a.stride_w})
                  .set_dilation({a.dil_h, a.dil_w});
  auto y = graph->conv_fprop(x, w, conv);
  if (fused) {
    y->set_data_type(fe::DataType_t::FLOAT);
    auto bias = graph->tensor(fe::graph::Tensor_attributes()
                                  .set_name("B")
                                  .set_uid(kUidB)
                                  .set_dim({1, call.ys[1], 1, 1})
                                  .set_stride(Packed({1, call.ys[1], 1, 1}, a.layout)));
    y = graph->pointwise(y, bias, fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
    if (residual) {
      y = graph->pointwise(y, tensor("Z", kUidZ, call.ys),
                           fe::graph::Pointwise_attributes().set_name("residual").set_mode(fe::PointwiseMode_t::ADD));
    }
    if (a.act == 1) {
      y = graph->pointwise(y, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
    }
  }
  y->set_output(true).set_uid(kUidY).set_data_type(FeType(call.dtype)).set_dim(
      {call.ys[0], call.ys[1], call.ys[2], call.ys[3]}).set_stride(Packed(call.ys, a.layout));
  if (call.dtype == kF32 && a.tf32 == 0) graph->deselect_numeric_notes({fe::NumericalNote_t::TENSOR_CORE});
  graph->deselect_workspace_greater_than(int64_t(call.ws.bytes));
  // each step only after the one before it succeeded
  if (fe::error_t e = graph->validate(); e.is_bad()) return e;
  if (fe::error_t e = graph->build_operation_graph(handle); e.is_bad()) return e;
  if (fe::error_t e = graph->create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) return e;
  if (fe::error_t e = graph->check_support(handle); e.is_bad()) return e;
  if (fe::error_t e = graph->build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad()) return e;
  int64_t ws = 0;
  if (fe::error_t e = graph->get_workspace_size(ws); e.is_bad()) return e;
  out->graph = graph;
  out->fused = fused;
  out->workspace = ws;
  return {fe::error_code_t::OK, ""};
}

void GraphConvImpl(const char* op, const TensorView& x, const TensorView& w, const TensorView& b, const TensorView* z,
                   const Shape& attrs, const TensorView& y, const TensorView& workspace) {
  const ConvCall call = CheckConv(op, x, w, b, z, attrs, y, workspace);
  if (z && DataPtr(*z) == DataPtr(y)) FailValue(op, "z must not be y here (nimble.cudnn.conv2d_add takes that)");
  if (call.a.algo != -1) FailValue(op, "attrs: the graph API chooses its own engine (entry 8 must be -1)");
  if (call.a.groups != 1) FailValue(op, "attrs: groups must be 1 here (grouped convolutions take nimble.cudnn.conv2d)");
  if (call.empty) return;
  DeviceGuard guard(call.dev, op);
  cudaStream_t stream = CurrentStream(call.dev);
  cudnnHandle_t handle = CudnnHandle(call.dev, stream, op);
  GraphKey key{};
  key[0] = call.dev, key[1] = call.dtype, key[2] = z != nullptr;
  for (int i = 0; i < 4; ++i) key[3 + i] = call.xs[i], key[7 + i] = call.wsh[i];
  for (int i = 0; i < 10; ++i) key[11 + i] = attrs[i];
  key[21] = call.a.layout;
  key[22] = int64_t(call.ws.bytes);
  ConvGraph* g;
  {
    std::lock_guard<std::mutex> lock(ConvGraphsMutex());
    auto& slot = ConvGraphs()[key];
    if (!slot) {
      auto built = std::make_unique<ConvGraph>();
      // relu6 has no pointwise node here: the convolution alone, our kernel after it
      fe::error_t fused = call.a.act <= 1 ? TryBuild(call, z != nullptr, true, handle, built.get())
                                                : fe::error_t{fe::error_code_t::GRAPH_NOT_SUPPORTED, "relu6"};
      fe::error_t err = fused.is_bad() ? TryBuild(call, z != nullptr, false, handle, built.get()) : fused;
      if (err.is_bad()) {
        TVM_FFI_THROW(RuntimeError) << op << ": cuDNN's graph API has no engine for x " << ShapeStr(x) << ", w "
                                    << ShapeStr(w) << " " << DTypeName(call.dtype) << " within " << call.ws.bytes
                                    << " workspace bytes: " << OneLine(err.get_message());
      }
      slot = std::move(built);
    }
    g = slot.get();
  }
  void* yp = DataPtr(y);
  void* zp = z ? DataPtr(*z) : nullptr;
  std::unordered_map<int64_t, void*> pack{{kUidX, DataPtr(x)}, {kUidW, DataPtr(w)}, {kUidY, yp}};
  if (g->fused) {
    pack[kUidB] = DataPtr(b);
    if (z) pack[kUidZ] = zp;
  }
  std::lock_guard<std::mutex> lock(g->mu);
  fe::error_t err = g->graph->execute(handle, pack, call.ws.ptr);
  if (err.is_bad()) {
    TVM_FFI_THROW(RuntimeError) << op << ": executing cuDNN's plan failed: " << OneLine(err.get_message());
  }
  if (!g->fused) LaunchConvBiasAct(op, call, yp, DataPtr(b), zp, stream);
}

void GraphConv2d(TensorView x, TensorView w, TensorView b, Shape attrs, TensorView y, TensorView workspace) {
  GraphConvImpl(kGraphConv, x, w, b, nullptr, attrs, y, workspace);
}

void GraphConv2dAdd(TensorView x, TensorView w, TensorView b, TensorView z, Shape attrs, TensorView y,
                    TensorView workspace) {
  GraphConvImpl(kGraphConvAdd, x, w, b, &z, attrs, y, workspace);
}

__attribute__((constructor)) void RegisterGraphConv() {
  try {
    Register(kGraphConv, GraphConv2d);
    Register(kGraphConvAdd, GraphConv2dAdd);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
