// cuBLASLt's whole configuration space for one GEMM, timed: the program of scripts/experiments/cublaslt_search.py.
//
//   cublaslt_search DTYPE M N K BETA
//
// Row-major y[M, N] = a[M, K] @ b[K, N] (+ y when BETA is 1: a residual, as nimble.cublas.matmul_add), fp32
// accumulation, DTYPE f16 / bf16 / f32, computed as the vendor extension does (column-major y^T = b^T a^T). Lists
//   - the heuristic's candidates (up to 16, what the build times today, before its split-K variants),
//   - every configuration cublasLtMatmulAlgoCheck accepts of every algorithm id (tiles x stages x cluster shapes x
//     split-K 1/2/4/8 with the compute-type reduction x custom options 0-3; CTA swizzle left at 0),
// screens each by 10 back-to-back calls, then re-times the 12 fastest screened and every heuristic candidate as a
// CUDA graph of 20 calls (what a replay pays, memset nodes included), and prints one line per re-timed candidate:
//   source index us algo tile stages split cluster memsets workspace custom
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define CHECK_LT(x)                                                                    \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Candidate {
  cublasLtMatmulAlgo_t algo;
  size_t ws = 0;
  bool heuristic = false;
  int index = 0;
  float screen_us = 0, us = 0;
  int memsets = 0;
};

static std::vector<uint32_t> CapArray(const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t attr) {
  size_t bytes = 0;
  if (cublasLtMatmulAlgoCapGetAttribute(algo, attr, nullptr, 0, &bytes) != CUBLAS_STATUS_SUCCESS || bytes == 0) {
    return {};
  }
  std::vector<uint32_t> out(bytes / sizeof(uint32_t));
  cublasLtMatmulAlgoCapGetAttribute(algo, attr, out.data(), bytes, &bytes);
  return out;
}

static uint32_t Config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;
  size_t got = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &got);
  return v;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: cublaslt_search f16|bf16|f32 M N K BETA\n");
    return 2;
  }
  const char* dname = argv[1];
  const int64_t M = std::atoll(argv[2]), N = std::atoll(argv[3]), K = std::atoll(argv[4]);
  const float beta = float(std::atoi(argv[5]));
  cudaDataType_t dt = !std::strcmp(dname, "f16") ? CUDA_R_16F : !std::strcmp(dname, "bf16") ? CUDA_R_16BF : CUDA_R_32F;
  size_t elt = dt == CUDA_R_32F ? 4 : 2;
  const size_t ws_bytes = 32u << 20;  // the offload's GEMM workspace

  void *a, *b, *y, *ws;
  CHECK_CUDA(cudaMalloc(&a, M * K * elt));
  CHECK_CUDA(cudaMalloc(&b, K * N * elt));
  CHECK_CUDA(cudaMalloc(&y, M * N * elt));
  CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  CHECK_CUDA(cudaMemset(a, 0, M * K * elt));
  CHECK_CUDA(cudaMemset(b, 0, K * N * elt));
  CHECK_CUDA(cudaMemset(y, 0, M * N * elt));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  CHECK_LT(cublasLtCreate(&lt));

  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t desc;
  CHECK_LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  cublasOperation_t op_n = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_n, sizeof(op_n)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  // column-major: "A" = b as [N, K] (ld N), "B" = a as [K, M] (ld K), D = y as [N, M] (ld N)
  cublasLtMatrixLayout_t la, lb, ld;
  CHECK_LT(cublasLtMatrixLayoutCreate(&la, dt, N, K, N));
  CHECK_LT(cublasLtMatrixLayoutCreate(&lb, dt, K, M, K));
  CHECK_LT(cublasLtMatrixLayoutCreate(&ld, dt, N, M, N));
  const float one = 1.0f;

  std::vector<Candidate> cands;
  {  // the heuristic's list, as the vendor extension asks for it
    cublasLtMatmulPreference_t pref;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
    cublasLtMatmulHeuristicResult_t res[16];
    int n = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 16, res, &n));
    for (int i = 0; i < n; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws_bytes) continue;
      Candidate c;
      c.algo = res[i].algo;
      c.ws = res[i].workspaceSize;
      c.heuristic = true;
      c.index = i;
      cands.push_back(c);
    }
    cublasLtMatmulPreferenceDestroy(pref);
  }
  const size_t n_heuristic = cands.size();
  {  // every configuration of every algorithm id that AlgoCheck accepts
    int ids[512];
    int nids = 0;
    CHECK_LT(cublasLtMatmulAlgoGetIds(lt, compute, CUDA_R_32F, dt, dt, dt, dt, 512, ids, &nids));
    for (int k = 0; k < nids; ++k) {
      cublasLtMatmulAlgo_t base;
      if (cublasLtMatmulAlgoInit(lt, compute, CUDA_R_32F, dt, dt, dt, dt, ids[k], &base) != CUBLAS_STATUS_SUCCESS) {
        continue;
      }
      std::vector<uint32_t> tiles = CapArray(&base, CUBLASLT_ALGO_CAP_TILE_IDS);
      std::vector<uint32_t> stages = CapArray(&base, CUBLASLT_ALGO_CAP_STAGES_IDS);
      size_t got = 0;
      // (no capability lists the cluster shapes: the small ones, each checked)
      const uint32_t clusters[] = {CUBLASLT_CLUSTER_SHAPE_AUTO, CUBLASLT_CLUSTER_SHAPE_1x1x1, CUBLASLT_CLUSTER_SHAPE_2x1x1,
                                   CUBLASLT_CLUSTER_SHAPE_1x2x1, CUBLASLT_CLUSTER_SHAPE_2x2x1};
      if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
      if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
      int32_t custom_max = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &custom_max, sizeof(custom_max),
                                        &got);
      int32_t splitk_support = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_support,
                                        sizeof(splitk_support), &got);
      uint32_t schemes = 0;
      cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes), &got);
      std::vector<int32_t> splits = {1};
      if (splitk_support && (schemes & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE)) splits = {1, 2, 4, 8};
      for (uint32_t tile : tiles) {
        for (uint32_t stage : stages) {
          for (uint32_t cluster : clusters) {
            for (int32_t split : splits) {
             for (uint32_t custom = 0; custom <= uint32_t(std::min(custom_max, 3)); ++custom) {
              cublasLtMatmulAlgo_t algo = base;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof(custom));
              uint32_t scheme = split > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof(stage));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                                   sizeof(cluster));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split));
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                   sizeof(scheme));
              cublasLtMatmulHeuristicResult_t r{};
              if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, ld, ld, &algo, &r) != CUBLAS_STATUS_SUCCESS ||
                  r.workspaceSize > ws_bytes) {
                continue;
              }
              Candidate c;
              c.algo = algo;
              c.ws = r.workspaceSize;
              c.index = int(cands.size() - n_heuristic);
              cands.push_back(c);
             }
            }
          }
        }
      }
    }
  }
  std::fprintf(stderr, "%zu heuristic candidates, %zu configurations", n_heuristic, cands.size() - n_heuristic);
  const size_t kMaxScreened = 3000;  // an even sample of the configurations beyond this many
  if (cands.size() - n_heuristic > kMaxScreened) {
    const size_t stride = (cands.size() - n_heuristic + kMaxScreened - 1) / kMaxScreened;
    std::vector<Candidate> kept(cands.begin(), cands.begin() + n_heuristic);
    for (size_t i = n_heuristic; i < cands.size(); i += stride) kept.push_back(cands[i]);
    cands.swap(kept);
    std::fprintf(stderr, " (every %zu-th screened)", stride);
  }
  std::fprintf(stderr, "\n");

  auto call = [&](const Candidate& c) {
    return cublasLtMatmul(lt, desc, &one, b, la, a, lb, &beta, y, ld, y, ld, &c.algo, ws, ws_bytes, stream);
  };
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  // screening: 2 warm-up calls, then 10 back to back between events
  std::vector<Candidate> ok;
  for (Candidate& c : cands) {
    if (call(c) != CUBLAS_STATUS_SUCCESS || call(c) != CUBLAS_STATUS_SUCCESS) {
      cudaGetLastError();
      continue;
    }
    CHECK_CUDA(cudaEventRecord(e0, stream));
    bool failed = false;
    for (int i = 0; i < 10 && !failed; ++i) failed = call(c) != CUBLAS_STATUS_SUCCESS;
    CHECK_CUDA(cudaEventRecord(e1, stream));
    if (cudaEventSynchronize(e1) != cudaSuccess || failed) {
      std::fprintf(stderr, "candidate failed; stopping the screen\n");
      break;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    c.screen_us = ms * 100.0f;
    ok.push_back(c);
  }
  std::vector<Candidate> timed;
  std::vector<Candidate> searched;
  for (const Candidate& c : ok) (c.heuristic ? timed : searched).push_back(c);
  std::sort(searched.begin(), searched.end(),
            [](const Candidate& x, const Candidate& y) { return x.screen_us < y.screen_us; });
  if (searched.size() > 12) searched.resize(12);
  timed.insert(timed.end(), searched.begin(), searched.end());
  // re-timing: a CUDA graph of 20 calls, replayed 5 times after a warm-up replay; the median replay / 20
  for (Candidate& c : timed) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 20; ++i) call(c);
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    size_t nodes = 0;
    CHECK_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
    std::vector<cudaGraphNode_t> all(nodes);
    CHECK_CUDA(cudaGraphGetNodes(graph, all.data(), &nodes));
    int memsets = 0;
    for (cudaGraphNode_t node : all) {
      cudaGraphNodeType type;
      CHECK_CUDA(cudaGraphNodeGetType(node, &type));
      memsets += type == cudaGraphNodeTypeMemset;
    }
    c.memsets = memsets / 20;
    CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    std::vector<float> rounds;
    for (int r = 0; r < 5; ++r) {
      CHECK_CUDA(cudaEventRecord(e0, stream));
      CHECK_CUDA(cudaGraphLaunch(exec, stream));
      CHECK_CUDA(cudaEventRecord(e1, stream));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      rounds.push_back(ms * 50.0f);
    }
    std::sort(rounds.begin(), rounds.end());
    c.us = rounds[2];
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  for (const Candidate& c : timed) {
    std::printf("%s %d %.2f %u %u %u %u %u %d %zu %u\n", c.heuristic ? "heuristic" : "search", c.index, c.us,
                Config(c.algo, CUBLASLT_ALGO_CONFIG_ID), Config(c.algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                Config(c.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), Config(c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                Config(c.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), c.memsets, c.ws,
                Config(c.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  }
  return 0;
}
