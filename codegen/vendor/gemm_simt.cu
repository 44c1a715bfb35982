// Our fp32 GEMM for the small M of batch-1 inference (provider simt_gemm):
//   y[M, N] = act(a[M, K] @ b[K, N] + bias[N] (+ z[M, N]))
// exact fp32 on the FMA pipes (no TF32), bias, residual and activation in the epilogue.
//
// Why: at M = 197 (a ViT's tokens) cuBLAS's fp32 kernels use large tiles, so ViT-S's GEMMs make 6-72 output tiles
// for 132 SMs and leave most of the FMA peak unused (see benchmarks/findings.md, 'Fused attention, where a ViT's
// time goes').
// Here the tiles are small (32-128 rows and columns, a thread's 4x4 to 8x8 register micro-tile) and K is split
// across the blocks of a thread-block cluster (Hopper): each block reduces its share of K into registers, parks
// its partial tile in shared memory, and after a cluster barrier each block sums one slice of the tile across
// the cluster's shared memories (distributed shared memory, a fixed order: deterministic), adds the epilogue and
// writes y. One launch, no workspace, no atomics, nothing to reset between CUDA-graph replays.
//
// Candidates: a tile variant and a split count each; the list is a function of (M, N, K). attrs [activation] runs
// the fastest, measured on the first call made outside a CUDA graph capture (as the cuDNN convolutions do; under a
// capture, without one, a static rule's pick); attrs [activation, index] runs candidate `index` (the build measures
// them all with nimble.gemm.matmul_timings and bakes the fastest in). The kernels are in gemm_simt_kernels.h,
// instantiated in gemm_simt_staged.cu and gemm_simt_pipelined.cu.
#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common.h"
#include "gemm_simt_kernels.h"

namespace nimble_vendor {
namespace {

constexpr const char* kSimtMatmul = "nimble.gemm.matmul";
constexpr const char* kSimtMatmulAdd = "nimble.gemm.matmul_add";
const int kSimtSplits[] = {1, 2, 3, 4, 6, 8};

struct SimtCandidate {
  int variant, splits, k_chunk;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The static rule: the least work on the busiest SM (blocks per SM x a block's multiply-adds), a split
// counting 32 more K columns for its reduction; ties to fewer splits.
double SimtCost(const SimtCandidate& c, int64_t M, int64_t N, int64_t sms) {
  const SimtShape& v = kSimtShapes[c.variant];
  const int64_t blocks = CeilDiv(M, v.bm) * CeilDiv(N, v.bn) * c.splits;
  return double(CeilDiv(blocks, sms)) * v.bm * v.bn * (c.k_chunk + (c.splits > 1 ? 32 : 0)) + c.splits;
}

// Every (variant, splits) worth timing for this shape, in a fixed order that depends on the shape alone (an index
// baked into an artifact means the same kernel on every GPU of its arch). A split needs thread-block clusters
// (sm_90 and later), at least one kBK stage of its own, and no more than 1,024 blocks in all.
std::vector<SimtCandidate> SimtCandidates(int64_t M, int64_t N, int64_t K, bool clusters) {
  std::vector<SimtCandidate> out;
  for (int v = 0; v < kSimtVariantCount; ++v) {
    const int64_t tiles = CeilDiv(M, kSimtShapes[v].bm) * CeilDiv(N, kSimtShapes[v].bn);
    for (int s : kSimtSplits) {
      const int64_t chunk = CeilDiv(CeilDiv(K, kBK), s) * kBK;
      if (s > 1 && (!clusters || (s - 1) * chunk >= K || tiles * s > 1024)) continue;
      out.push_back({v, s, int(chunk)});
    }
  }
  return out;
}

bool HasClusters() {  // the current device's: compute capability 9.0 or later (no answer: an older one)
  return DeviceAttribute<cudaDevAttrComputeCapabilityMajor>(1) >= 9;
}

// The static rule's pick among `cands` (what a call without an index runs when it cannot measure)
int SimtStaticPick(const std::vector<SimtCandidate>& cands, int64_t M, int64_t N, int64_t sms) {
  int best = 0;
  for (int i = 1; i < int(cands.size()); ++i) {
    if (SimtCost(cands[i], M, N, sms) < SimtCost(cands[best], M, N, sms)) best = i;
  }
  return best;
}

struct SimtCall {
  const char* op = kSimtMatmul;
  int dev = 0;
  SimtArgs p{};
  int64_t index = -1;  // the candidate (-1: the fastest, measured on the first call)
  std::string attrs_str;
};

SimtCall CheckSimt(const char* op, TensorView a, TensorView b, TensorView bias, const TensorView* z, const Shape& attrs,
                   TensorView y, TensorView workspace) {
  SimtCall g;
  g.op = op;
  if (attrs.size() != 1 && attrs.size() != 2) {
    FailValue(op, "attrs must be [activation(, candidate index)], got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  g.p.act = int(attrs[0]);
  g.index = attrs.size() == 2 ? attrs[1] : -1;
  if (g.p.act < 0 || g.p.act > kSimtMaxActivation) {
    FailValue(op, "activation must be 0 (none), 1 (relu), 2 (relu6) or 3 (gelu), got " + std::to_string(attrs[0]) +
                      " (GELU's tanh form is cuBLASLt's epilogue, not this kernel's)");
  }
  if (g.index < -1) FailValue(op, "the candidate index must be >= 0, got " + std::to_string(g.index));
  if (a.device().device_type != kDLCUDA) {
    FailValue(op, "a must be a CUDA tensor, got device type " + std::to_string(a.device().device_type));
  }
  g.dev = a.device().device_id;
  const std::pair<const char*, const TensorView*> tensors[] = {{"a", &a}, {"b", &b}, {"bias", &bias}, {"y", &y}};
  for (auto& [name, t] : tensors) {
    CheckCudaTensor(op, name, *t, g.dev);
    if (TensorDType(*t) != kF32) {
      FailValue(op, std::string(name) + " has dtype " + DLTypeStr(t->dtype()) + ": this kernel is float32 only");
    }
  }
  CheckWorkspace(op, workspace, g.dev);
  if (a.ndim() < 2) FailValue(op, "a must be [..., M, K], got " + ShapeStr(a));
  CheckNdim(op, "b", b, 2);
  CheckNdim(op, "bias", bias, 1);
  const int64_t K = a.shape()[a.ndim() - 1], M = a.numel() / std::max<int64_t>(K, 1), N = b.shape()[1];
  if (b.shape()[0] != K) FailValue(op, "a " + ShapeStr(a) + " and b " + ShapeStr(b) + " ([K, N]) disagree on K");
  if (bias.shape()[0] != N) FailValue(op, "bias has shape " + ShapeStr(bias) + " but N = " + std::to_string(N));
  CheckRows(op, y, M, N, "a " + ShapeStr(a) + " and b " + ShapeStr(b));
  if (K % 4 || N % 4) FailValue(op, "K and N must be multiples of 4 (float4 rows), got K = " + std::to_string(K) +
                                        ", N = " + std::to_string(N));
  if (M > int64_t(65535) * 32 || K >= (int64_t(1) << 30) || N >= (int64_t(1) << 30)) {
    FailValue(op, "M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K) + " is too large");
  }
  if (DataPtr(y) == DataPtr(a) || DataPtr(y) == DataPtr(b)) FailValue(op, "y must not alias a or b");
  g.p.a = static_cast<const float*>(DataPtr(a)), g.p.b = static_cast<const float*>(DataPtr(b));
  g.p.bias = static_cast<const float*>(DataPtr(bias)), g.p.y = static_cast<float*>(DataPtr(y));
  if (z) {
    CheckCudaTensor(op, "z", *z, g.dev);
    if (TensorDType(*z) != kF32) FailValue(op, "z has dtype " + DLTypeStr(z->dtype()) + ": this kernel is float32 only");
    bool same = z->ndim() == y.ndim();
    for (int i = 0; same && i < y.ndim(); ++i) same = z->shape()[i] == y.shape()[i];
    if (!same) FailValue(op, "z has shape " + ShapeStr(*z) + " but y has " + ShapeStr(y) + ": they must be equal");
    g.p.z = static_cast<const float*>(DataPtr(*z));
  }
  for (const void* ptr : {static_cast<const void*>(g.p.a), static_cast<const void*>(g.p.b),
                          static_cast<const void*>(g.p.bias), static_cast<const void*>(g.p.y),
                          static_cast<const void*>(g.p.z)}) {
    if (ptr && PtrAlign(ptr) < 16) FailValue(op, "every tensor must start 16-byte aligned (float4 loads)");
  }
  g.p.M = int(M), g.p.N = int(N), g.p.K = int(K);
  g.attrs_str = ShapeStr(attrs.data(), int(attrs.size()));
  return g;
}

// Candidate c's kernel, in the unit of its kind
cudaError_t LaunchCandidate(const SimtCandidate& c, SimtArgs p, cudaStream_t stream) {
  p.k_chunk = c.k_chunk;
  return kSimtShapes[c.variant].pipelined ? LaunchSimtPipelined(c.variant, p, c.splits, stream)
                                          : LaunchSimtStaged(c.variant, p, c.splits, stream);
}

void EnqueueSimt(const SimtCall& g, const SimtCandidate& c, cudaStream_t stream) {
  CheckCuda(LaunchCandidate(c, g.p, stream), g.op, "cudaLaunchKernelEx");
}

// a candidate this GPU refuses to launch (a cluster shape it cannot schedule) times as this many microseconds
constexpr double kRefusedUs = 1e9;

// Microseconds per call of each candidate, each over `reps` back-to-back calls queued behind a spin kernel.
// Synchronizes: never inside a graph capture.
std::vector<double> TimeSimt(const SimtCall& g, const std::vector<SimtCandidate>& cands, int64_t reps,
                             cudaStream_t stream) {
  std::vector<double> out;
  for (size_t i = 0; i < cands.size(); ++i) {
    const cudaError_t err = LaunchCandidate(cands[i], g.p, stream);
    if (err != cudaSuccess) {  // a launch-configuration error, not sticky: this candidate is out
      cudaGetLastError();
      out.push_back(kRefusedUs);
      continue;
    }
    const double us = GpuUsPerCall(stream, reps, [&] {
      return LaunchCandidate(cands[i], g.p, stream) == cudaSuccess;
    });
    if (us < 0) FailValue(g.op, "timing candidate " + std::to_string(i) + " failed (a launch or CUDA events)");
    out.push_back(us);
  }
  if (!out.empty() && *std::min_element(out.begin(), out.end()) >= kRefusedUs) {
    FailValue(g.op, "this GPU launches none of the candidates for M = " + std::to_string(g.p.M) + ", N = " +
                        std::to_string(g.p.N) + ", K = " + std::to_string(g.p.K));
  }
  return out;
}

bool Capturing(cudaStream_t stream, const char* op) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CheckCuda(cudaStreamIsCapturing(stream, &capturing), op, "cudaStreamIsCapturing");
  return capturing != cudaStreamCaptureStatusNone;
}

// the candidate a call without an index runs, per (device, M, N, K, activation, residual): measured once
std::mutex& ChosenMutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::array<int64_t, 6>, int>& Chosen() {
  static std::map<std::array<int64_t, 6>, int> chosen;
  return chosen;
}

void RunSimt(const SimtCall& g) {
  if (g.p.M == 0 || g.p.N == 0) return;
  DeviceGuard guard(g.dev, g.op);
  cudaStream_t stream = CurrentStream(g.dev);
  const std::vector<SimtCandidate> cands = SimtCandidates(g.p.M, g.p.N, g.p.K, HasClusters());
  if (g.index >= int64_t(cands.size())) {
    FailValue(g.op, "candidate " + std::to_string(g.index) + " does not exist: M = " + std::to_string(g.p.M) +
                        ", N = " + std::to_string(g.p.N) + ", K = " + std::to_string(g.p.K) + " has " +
                        std::to_string(cands.size()) + " (an artifact of another tvm-nimble version: rebuild the model)");
  }
  int index = int(g.index);
  if (index < 0) {
    const std::array<int64_t, 6> key{g.dev, g.p.M, g.p.N, g.p.K, g.p.act, g.p.z ? 1 : 0};
    std::lock_guard<std::mutex> lock(ChosenMutex());
    auto it = Chosen().find(key);
    if (it != Chosen().end()) {
      index = it->second;
    } else if (Capturing(stream, g.op) || g.p.z == g.p.y) {
      // under a capture nothing can be timed; and a residual z that is y itself would be added again by every
      // candidate timed
      index = SimtStaticPick(cands, g.p.M, g.p.N, SmCount());
    } else {
      const std::vector<double> us = TimeSimt(g, cands, 10, stream);
      index = int(std::min_element(us.begin(), us.end()) - us.begin());
      Chosen()[key] = index;
    }
  }
  EnqueueSimt(g, cands[index], stream);
}

void SimtMatmul(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  RunSimt(CheckSimt(kSimtMatmul, a, b, bias, nullptr, attrs, y, workspace));
}

void SimtMatmulAdd(TensorView a, TensorView b, TensorView bias, TensorView z, Shape attrs, TensorView y,
                   TensorView workspace) {
  RunSimt(CheckSimt(kSimtMatmulAdd, a, b, bias, &z, attrs, y, workspace));
}

Array<double> SimtTimings(const SimtCall& g, int64_t reps) {
  Array<double> out;
  if (g.p.M == 0 || g.p.N == 0) return out;
  if (reps < 1) FailValue(g.op, "reps must be >= 1, got " + std::to_string(reps));
  DeviceGuard guard(g.dev, g.op);
  cudaStream_t stream = CurrentStream(g.dev);
  if (Capturing(stream, g.op)) FailValue(g.op, "timings cannot be taken inside a CUDA graph capture");
  for (double us : TimeSimt(g, SimtCandidates(g.p.M, g.p.N, g.p.K, HasClusters()), reps, stream)) out.push_back(us);
  return out;
}

Array<double> SimtMatmulTimings(TensorView a, TensorView b, TensorView bias, Shape attrs, TensorView y,
                                TensorView workspace, int64_t reps) {
  return SimtTimings(CheckSimt(kSimtMatmul, a, b, bias, nullptr, attrs, y, workspace), reps);
}

Array<double> SimtMatmulAddTimings(TensorView a, TensorView b, TensorView bias, TensorView z, Shape attrs, TensorView y,
                                   TensorView workspace, int64_t reps) {
  return SimtTimings(CheckSimt(kSimtMatmulAdd, a, b, bias, &z, attrs, y, workspace), reps);
}

// "BMxBN/S" (tile rows x columns / K splits; "BMxBNpBK/S": the pipelined kernel, BK columns of K a stage) of each
// candidate of an (M, N, K), by index, on a GPU with thread-block
// clusters or without (for explain and the experiments)
Array<String> SimtCandidateNames(int64_t M, int64_t N, int64_t K, bool clusters) {
  Array<String> out;
  if (M < 1 || N < 1 || K < 1) FailValue("nimble.gemm.candidates", "M, N and K must be >= 1");
  for (const SimtCandidate& c : SimtCandidates(M, N, K, clusters)) {
    const SimtShape& v = kSimtShapes[c.variant];
    out.push_back(String(std::to_string(v.bm) + "x" + std::to_string(v.bn) + (v.pipelined ? "p" + std::to_string(v.bk) : "") +
                         "/" + std::to_string(c.splits)));
  }
  return out;
}

__attribute__((constructor)) void RegisterSimt() {
  try {
    Register(kSimtMatmul, SimtMatmul);
    Register(kSimtMatmulAdd, SimtMatmulAdd);
    Register("nimble.gemm.matmul_timings", SimtMatmulTimings);
    Register("nimble.gemm.matmul_add_timings", SimtMatmulAddTimings);
    Register("nimble.gemm.candidates", SimtCandidateNames);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
