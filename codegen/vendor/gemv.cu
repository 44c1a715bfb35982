// Our GEMV for the few rows of a decode step (provider gemv): 16-bit weights read once, at the memory's speed.
//
//   nimble.gemv.matmul(a, w, bias, attrs, y, workspace)
//   nimble.gemv.matmul_add(a, w, bias, z, attrs, y, workspace)
//       y[m, n] = act(sum_k a[m, k] * w[n, k] + bias[n] (+ z[m, n])); a [..., M, K] (rows flattened, M <= 8),
//       w [N, K] (the provider stores every Linear's weights so), a and w fp16 or bf16; bias, z and y in a's dtype or
//       float32 (a residual stream kept in fp32); y any shape of M rows of N; attrs = [activation] (0 identity,
//       1 relu, 2 relu6, 3 gelu, 4 gelu's tanh approximation). fp32 accumulation, rounded once.
//   nimble.gemv.norm_matmul(x, gamma, beta, w, bias, attrs, y, workspace)
//   nimble.gemv.norm_matmul_add(x, gamma, beta, w, bias, z, attrs, y, workspace)
//       the same of a = norm(x) rounded to w's dtype, the norm over the last axis in float32: LayerNorm
//       ((x - mean) / sqrt(var + eps) * gamma + beta) or RMSNorm (x / sqrt(mean(x^2) + eps) * gamma, beta unused);
//       x [..., 1, K] (one row) float32 or w's dtype, K <= 4096; gamma and beta [K] float32; attrs = [activation,
//       norm (1 layer, 2 RMS), eps (float32 bits)]. A decoder layer's norm before its projection, in the GEMV's
//       prologue: each block normalizes the row itself (x is a few KB, read from L2) into shared memory -- one kernel
//       fewer a norm.
//   nimble.gemv.glu_matmul(a, w, bias, attrs, y, workspace)
//   nimble.gemv.glu_norm_matmul(x, gamma, beta, w, bias, attrs, y, workspace)
//       a gated MLP's merged gate/up projection and its gate in one (one row): w [2I, K] holds the gate's and the up
//       projection's rows interleaved (row 2j gate j, row 2j + 1 up j; bias likewise), y [..., 1, I] in w's dtype,
//       y[j] = silu(g_j) * u_j with g and u (and silu's sigmoid and product) rounded to the dtype as the unfused
//       16-bit operators round them; attrs = [glu (1: SiLU)] or, with the norm prologue, [glu, norm, eps bits].
//       Llama's and Qwen's MLP up to its down projection: one kernel instead of the projection and the gate's.
//
// Why: at M = 1 a Linear is a matrix-vector product whose time is reading W. cuBLASLt's kernels for it (64x8
// tiles, split-K with a second reduction kernel) ran GPT-2's decode GEMMs well under the memory's bandwidth
// (benchmarks/findings.md, 'Decode steps on the H200'). Here each output column is a row of W read by
// S warps (S = 1, 2, 4 or 8, as many as the grid needs to fill the GPU: a short, wide W is split along K), each
// lane 16 bytes a load, four loads in flight; the S partial sums meet in shared memory, and the column's epilogue
// is one thread's. K must be a multiple of 8 and every tensor 16-byte aligned (the provider and the checks here
// say so in one line otherwise). The workspace is unused (the vendor calling convention).
//
// Two to eight rows (plain and residual calls; the norm's prologue and the gate take one row) go to the tensor cores
// from NIMBLE_GEMV_MMA_ROWS rows on (default 5; 9 never): FMA-bound on the CUDA cores at 8 rows (every weight
// multiplied 8 times), the product is one mma.sync.m16n8k16 per 16 columns x 16 k, w's rows as its A operand and the
// rows of a, padded to 8 with zeros, as its B operand (the swapped product of a narrow GEMM). A lane loads 16 bytes
// of w's rows g and g + 8 and of a's row g at the same k, and hands them to the MMA in its fragment order: the k of
// a fragment slot is a permutation of the k loaded, the same for A and B, so the sum over k is unchanged. A warp
// takes 16 columns; S warps of a block share them, each a K slice, as the CUDA-core kernel's columns.
//
// Launched with programmatic dependent launch (common.h): a lane's first weight loads are issued before the kernel
// waits for the one before it, so a decode step's weight reads overlap the kernels that produce its activations.
//
// The kernels and their launch are gemv_kernels.h's, instantiated in a unit per weight dtype (gemv_f16.cu,
// gemv_bf16.cu); this unit checks and registers the calls.
#include <cmath>
#include <cstring>
#include <string>

#include "common.h"
#include "gemv_kernels.h"

namespace nimble_vendor {
namespace {

constexpr const char* kGemv = "nimble.gemv.matmul";
constexpr const char* kGemvAdd = "nimble.gemv.matmul_add";
constexpr const char* kNormGemv = "nimble.gemv.norm_matmul";
constexpr const char* kNormGemvAdd = "nimble.gemv.norm_matmul_add";
constexpr const char* kGluMatmul = "nimble.gemv.glu_matmul";
constexpr const char* kGluNormMatmul = "nimble.gemv.glu_norm_matmul";

// a: the GEMV's input rows, or (with `norm`) x, whose rows the kernel normalizes first
void RunGemv(const char* op, TensorView a, const TensorView* gamma, const TensorView* beta, TensorView w,
             TensorView bias, const TensorView* z, const Shape& attrs, TensorView y, TensorView workspace,
             bool glu = false) {
  const bool norm = gamma != nullptr;
  const size_t nattrs = norm ? 3 : 1;
  const char* first_attr = glu ? "glu" : "activation";
  if (attrs.size() != nattrs) {
    FailValue(op, std::string("attrs must be [") + first_attr + (norm ? ", norm, eps (float32 bits)]" : "]") +
                      ", got " + ShapeStr(attrs.data(), int(attrs.size())));
  }
  const int act = glu ? 0 : int(attrs[0]);
  if (glu && attrs[0] != kSiluGlu) FailValue(op, "glu must be 1 (SiLU), got " + std::to_string(attrs[0]));
  if (act < 0 || act > kMaxActivation) {
    FailValue(op, std::string("activation must be ") + kActivations + ", got " + std::to_string(attrs[0]));
  }
  const char* name = norm ? "x" : "a";
  if (a.device().device_type != kDLCUDA) FailValue(op, std::string(name) + " must be a CUDA tensor");
  const int dev = a.device().device_id;
  const int dtype = TensorDType(w);
  if (dtype != kF16 && dtype != kBF16) {
    FailValue(op, "w has dtype " + DLTypeStr(w.dtype()) + ": this kernel takes float16 or bfloat16 (fp32 GEMMs are "
                  "cuBLASLt's or nimble.gemm's)");
  }
  CheckCudaTensor(op, name, a, dev);
  CheckCudaTensor(op, "w", w, dev);
  CheckCudaTensor(op, "bias", bias, dev);
  CheckCudaTensor(op, "y", y, dev);
  CheckWorkspace(op, workspace, dev);
  const int a_dtype = TensorDType(a);
  if (a_dtype != dtype && !(norm && a_dtype == kF32)) {
    FailValue(op, std::string(name) + " has dtype " + DLTypeStr(a.dtype()) + " but w has " + DTypeName(dtype) +
                      (norm ? ": x must be float32 or w's dtype" : ""));
  }
  const int out_dtype = GemmOutDType(op, dtype, y, bias);
  if (a.ndim() < 2) FailValue(op, std::string(name) + " must be [..., M, K], got " + ShapeStr(a));
  CheckNdim(op, "w", w, 2);
  CheckNdim(op, "bias", bias, 1);
  const int64_t K = a.shape()[a.ndim() - 1], M = a.numel() / std::max<int64_t>(K, 1), N = w.shape()[0];
  if (w.shape()[1] != K) {
    FailValue(op, std::string(name) + " " + ShapeStr(a) + " and w " + ShapeStr(w) + " ([N, K]) disagree on K");
  }
  if (M < 1 || M > kGemvMaxRows) {
    FailValue(op, std::string(name) + " has " + std::to_string(M) + " rows: this kernel takes 1 to " +
                      std::to_string(kGemvMaxRows));
  }
  if (K % 8) FailValue(op, "K = " + std::to_string(K) + " must be a multiple of 8 (16-byte loads)");
  if (bias.shape()[0] != N) FailValue(op, "bias has shape " + ShapeStr(bias) + " but N = " + std::to_string(N));
  if (glu) {
    if (M != 1) FailValue(op, std::string(name) + " has " + std::to_string(M) + " rows: the gate takes one");
    if (N % 2) FailValue(op, "w has " + std::to_string(N) + " rows: the gate takes pairs (gate, up)");
    if (out_dtype != dtype) FailValue(op, std::string("y must have w's dtype ") + DTypeName(dtype));
  }
  CheckRows(op, y, M, glu ? N / 2 : N, std::string(name) + " " + ShapeStr(a) + " and w " + ShapeStr(w));
  if (N >= (int64_t(1) << 31) / kGemvWarps || K >= (int64_t(1) << 30)) FailValue(op, "N or K is too large");
  if (z) {
    CheckCudaTensor(op, "z", *z, dev);
    CheckDType(op, "z", *z, out_dtype);
    if (z->numel() != y.numel()) FailValue(op, "z has shape " + ShapeStr(*z) + " but y has " + ShapeStr(y));
  }
  GemvArgs p{DataPtr(a), DataPtr(w), DataPtr(bias), z ? DataPtr(*z) : nullptr, DataPtr(y), int(N), int(K), act, {},
             glu ? int(attrs[0]) : int(kNoGlu), int(M)};
  if (norm) {
    const int kind = int(attrs[1]);
    if (kind != kLayerNorm && kind != kRmsNorm) {
      FailValue(op, "norm must be 1 (LayerNorm) or 2 (RMSNorm), got " + std::to_string(attrs[1]));
    }
    if (M != 1) FailValue(op, "x has " + std::to_string(M) + " rows: the norm's prologue takes one");
    if (K > kNormMaxK) {
      FailValue(op, "the normalized axis has " + std::to_string(K) + " elements; at most " +
                        std::to_string(kNormMaxK) + " are supported");
    }
    for (const auto& [pname, t] : {std::pair<const char*, const TensorView*>{"gamma", gamma}, {"beta", beta}}) {
      CheckCudaTensor(op, pname, *t, dev);
      CheckDType(op, pname, *t, kF32);
      CheckNdim(op, pname, *t, 1);
      if (t->shape()[0] != K) FailValue(op, std::string(pname) + " has shape " + ShapeStr(*t) + " but K = " +
                                                std::to_string(K));
    }
    const uint32_t bits = uint32_t(attrs[2]);
    float eps;
    std::memcpy(&eps, &bits, sizeof(eps));
    if (!(eps >= 0.0f) || !std::isfinite(eps)) FailValue(op, "eps must be a finite float32 >= 0, got " + std::to_string(eps));
    p.a = nullptr;
    p.norm = GemvNorm{DataPtr(a), static_cast<const float*>(DataPtr(*gamma)), static_cast<const float*>(DataPtr(*beta)),
                      kind, a_dtype == kF32 ? 1 : 0, eps};
    if (DataPtr(y) == DataPtr(a)) FailValue(op, "y must not alias x");
  } else if (PtrAlign(DataPtr(a)) < 16 || DataPtr(y) == DataPtr(a)) {
    FailValue(op, "a must start 16-byte aligned and y must not alias it");
  }
  if (PtrAlign(DataPtr(w)) < 16) FailValue(op, "w must start 16-byte aligned");
  if (DataPtr(y) == DataPtr(w)) FailValue(op, "y must not alias w");
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  const int most = glu ? kGemvWarps / 2 : kGemvWarps;  // the gate: column pairs a block
  cudaError_t err;
  if (dtype == kF16) err = LaunchGemvF16(int(M), most, p, out_dtype == kF32, stream);
  else err = LaunchGemvBF16(int(M), most, p, out_dtype == kF32, stream);
  CheckCuda(err, op, "cudaLaunchKernelEx");
}

void Gemv(TensorView a, TensorView w, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  RunGemv(kGemv, a, nullptr, nullptr, w, bias, nullptr, attrs, y, workspace);
}

void GemvAdd(TensorView a, TensorView w, TensorView bias, TensorView z, Shape attrs, TensorView y,
             TensorView workspace) {
  RunGemv(kGemvAdd, a, nullptr, nullptr, w, bias, &z, attrs, y, workspace);
}

void NormGemv(TensorView x, TensorView gamma, TensorView beta, TensorView w, TensorView bias, Shape attrs, TensorView y,
              TensorView workspace) {
  RunGemv(kNormGemv, x, &gamma, &beta, w, bias, nullptr, attrs, y, workspace);
}

void NormGemvAdd(TensorView x, TensorView gamma, TensorView beta, TensorView w, TensorView bias, TensorView z,
                 Shape attrs, TensorView y, TensorView workspace) {
  RunGemv(kNormGemvAdd, x, &gamma, &beta, w, bias, &z, attrs, y, workspace);
}

void GluGemv(TensorView a, TensorView w, TensorView bias, Shape attrs, TensorView y, TensorView workspace) {
  RunGemv(kGluMatmul, a, nullptr, nullptr, w, bias, nullptr, attrs, y, workspace, true);
}

void GluNormGemv(TensorView x, TensorView gamma, TensorView beta, TensorView w, TensorView bias, Shape attrs,
                 TensorView y, TensorView workspace) {
  RunGemv(kGluNormMatmul, x, &gamma, &beta, w, bias, nullptr, attrs, y, workspace, true);
}

__attribute__((constructor)) void RegisterGemv() {
  try {
    Register(kGemv, Gemv);
    Register(kGemvAdd, GemvAdd);
    Register(kNormGemv, NormGemv);
    Register(kNormGemvAdd, NormGemvAdd);
    Register(kGluMatmul, GluGemv);
    Register(kGluNormMatmul, GluNormGemv);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
