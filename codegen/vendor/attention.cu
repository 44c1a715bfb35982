// Fused scaled-dot-product attention for small-batch inference, one kernel instead of Nimble's
// transposes + Q·Kᵀ + scale + softmax + ·V + transpose (seven launches per attention in a ViT):
//
//   nimble.attention.sdpa(q, k, v, attrs, y, workspace)
//   nimble.attention.sdpa_bias(q, k, v, bias, attrs, y, workspace)
//       y[b, h, s, :] = softmax_j(scale * q[b, h, s, :] · k[b, h, j, :] (+ bias[b, h, s, j])) @ v[b, h, j, :]
//
// q, k, v, bias and y are the tensors the model has (e.g. q, k and v all the QKV Linear's output
// [B, S, 3 * H * D]); each operand is read through a strided view of its tensor given in attrs, so
// the head split, the transposes and the head merge cost no kernel:
//   attrs = [B, H, Sq, Sk, D, Dv,
//            q_offset, q_stride_b, q_stride_h, q_stride_s,  k_offset, k_stride_b, k_stride_h, k_stride_s,
//            v_offset, v_stride_b, v_stride_h, v_stride_s,  y_stride_b, y_stride_h, y_stride_s,
//            bias_stride_b, bias_stride_h, bias_stride_sq, bias_stride_sk,  scale (float32 bits) [, group]]
// in elements; the head dimension is contiguous (stride 1) everywhere; a bias stride of 0 broadcasts
// (a [B, 1, 1, Sk] padding mask). group (absent: 1): query heads per KV head (grouped-query attention): k and v
// have H / group heads and query head h reads their head h / group, so a decoder's repeated K/V is never
// materialised. A row whose scores are all -inf (a fully masked query) outputs 0, not NaN. fp32, fp16 or bf16 in and out (the bias in the same dtype or fp32),
// fp32 softmax and accumulation.
//
// Three kernels, all fp32 math, written for batch-1 inference, where a flash kernel's large tiles leave
// most SMs idle (cuDNN's fused attention has no fp32 path). The first two use the online softmax (running
// max and sum per row), so any Sk fits. The workspace is unused (the vendor calling convention).
// - nimble.attention.sdpa / sdpa_bias: the row-per-warp kernel, one query row per warp, key tiles
//   through shared memory, the next tile fetched into registers while the current one is computed on.
//   Checked against float64 and timed on an H100 (scripts/experiments/attention_check.py); latency-bound
//   at batch 1 (one 32-key tile 3.6 us, each further one 1.3 us: 27 us for ViT-B's 197 keys).
// - nimble.attention.split_sdpa / split_sdpa_bias (same attrs): for head dimensions up to 64 (ViT, BERT)
//   the split-key kernel: a block takes R query rows and up to eight warps; warp w takes key tiles
//   w, w + 8, ... (32 keys, one per lane) for all R rows, so a warp's tiles do not wait on each other and
//   each lane works on R rows at once; the warps' partials (max, sum, weighted values) are combined
//   through shared memory at the end. R (16, 8 or 4) is chosen from the grid's waves over the GPU's SMs
//   (LaunchSplitRows, attention_split.h). Where the grid has one block of rows per head (a decode step: one query
//   row), the keys are split over the C blocks of a thread-block cluster too (Hopper; C up to 8, as many as fill
//   the SMs), block c taking tiles c * warps + w, ..., and the partials of all the cluster's warps combined through
//   distributed shared memory (one block a head left most SMs idle: benchmarks/findings.md, 'Decode steps on the
//   H200').
//   Larger heads take the row-per-warp kernel. It matches float64 as closely as ours, but
//   is faster only for ViT-S-sized and long sequences (see benchmarks/findings.md, 'Attention kernels, build
//   times, serving googlenet, PyTorch's half precision by layout'); its provider (attention_split) is one of the
//   candidates the kernel choice measures against ours per operator (ViT-S fp32 takes it).
// - A call of one query row per head (a decode step) with D = Dv of 64 or 128 and 16-byte aligned rows runs the
//   decode kernel instead (attention_decode.cu), whichever of the two calls above it came through: each thread its
//   own online softmax over its keys (no barrier per key tile, K and V loaded together, the next chunk's loads in
//   flight), the keys split over the blocks of a thread-block cluster (SdpaDecodeKernel; GPT-2's decode attention
//   16.6 -> 4.9 us a layer: benchmarks/findings.md, 'The decode attention as a kernel of its own').
// - nimble.attention.append_sdpa_bias(q, k_cache, v_cache, bias, k_new, v_new, positions, attrs, y, workspace), in
//   attention_decode.cu: a decode step's cache write and its attention in one call (the same attrs, k and v the
//   caches, Sq = 1): k_cache[b, g, positions[b], :] = k_new[b, g, :] (and v alike) for every KV head g, then
//   sdpa_bias over the caches, as the cache write kernel followed by split_sdpa_bias computes it. k_new / v_new are
//   [B, KV heads, D] contiguous
//   (any shape of that many elements), positions int64 [B]; a position outside the cache writes nothing. The caches
//   are written in place (the contract's IN_PLACE). The decode kernel reads the new key and value where the cache
//   would hold them, and one block per KV head writes them (no block reads that slot of the cache, so the write
//   races with nothing); a call the decode kernel does not take writes the caches first, then runs split_sdpa_bias.
// - nimble.attention.append_rope_sdpa_bias(q, k_cache, v_cache, bias, k_new, v_new, positions, cos, sin, attrs, y,
//   workspace): the same with the rotary embedding of q and k_new before it, as a Llama-style decoder computes it:
//   x * cos + rotate_half(x) * sin in fp32 (rotate_half(x) = [-x[D/2:], x[:D/2]]), rounded to the dtype; cos and sin
//   fp32 [B, D] (the position's row); q read as [B, H, D] contiguous (q_offset 0). The workspace holds the rotated q
//   of a call the decode kernel does not take (B * H * D elements).
// - nimble.attention.tile_sdpa / tile_sdpa_bias (same attrs): the register-tiled kernel, in attention_tile.h.
// - nimble.attention.cluster_sdpa / cluster_sdpa_bias (same attrs): the key-split fp32 kernel (a query tile's key
//   chunks on the blocks of a thread-block cluster, merged through distributed shared memory), in
//   attention_cluster.cu; a call it does not take runs the tile kernel.
#include <algorithm>
#include <cstdint>

#include "attention_kernels.h"
#include "common.h"
#include "sdpa_args.h"

namespace nimble_vendor {
namespace {

constexpr const char* kSdpa = "nimble.attention.sdpa";
constexpr const char* kSdpaBias = "nimble.attention.sdpa_bias";
constexpr const char* kSplit = "nimble.attention.split_sdpa";
constexpr const char* kSplitBias = "nimble.attention.split_sdpa_bias";
constexpr const char* kTile = "nimble.attention.tile_sdpa";
constexpr const char* kTileBias = "nimble.attention.tile_sdpa_bias";
constexpr const char* kCluster = "nimble.attention.cluster_sdpa";
constexpr const char* kClusterBias = "nimble.attention.cluster_sdpa_bias";
enum class Kernel { kRowPerWarp, kSplitKey, kTile, kCluster };

// q, k, v of `dtype` (the mask in fp32 when f32_mask) on the row-per-warp or split-key kernel; a call of one query row
// per head (a decode step) the decode kernel takes (attention_decode.cu) runs that instead.
void LaunchAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k, const void* v,
                     const void* m, void* y, Kernel kernel, cudaStream_t stream) {
  if (LaunchDecodeAttention(p, dtype, f32_mask, q, k, v, m, y, stream)) return;
  if (kernel != Kernel::kSplitKey || std::max(p.D, p.Dv) > 64) {
    LaunchRowPerWarpAttention(p, dtype, f32_mask, q, k, v, m, y, stream);
  } else if (dtype == kF32) {
    LaunchSplitKeyF32(p, q, k, v, m, y, stream);
  } else if (dtype == kF16) {
    LaunchSplitKeyF16(p, f32_mask, q, k, v, m, y, stream);
  } else {
    LaunchSplitKeyBF16(p, f32_mask, q, k, v, m, y, stream);
  }
}

// The tile kernel's unit of `dtype`; false when the head does not fit (nothing launched)
bool LaunchTile(const char* op, const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k,
                const void* v, const void* m, void* y, cudaStream_t stream) {
  if (dtype == kF32) return LaunchTileF32(op, p, q, k, v, m, y, stream);
  if (dtype == kF16) return LaunchTileF16(op, p, f32_mask, q, k, v, m, y, stream);
  return LaunchTileBF16(op, p, f32_mask, q, k, v, m, y, stream);
}

void SdpaImpl(const char* op, TensorView q, TensorView k, TensorView v, const TensorView* bias, const Shape& attrs,
              TensorView y, TensorView workspace, Kernel kernel = Kernel::kRowPerWarp) {
  int dtype = 0;
  const SdpaParams p = CheckSdpa(op, q, k, v, bias, attrs, y, workspace, &dtype);
  const int dev = q.device().device_id;
  DeviceGuard guard(dev, op);
  cudaStream_t stream = CurrentStream(dev);
  const void* mp = bias ? DataPtr(*bias) : nullptr;
  const bool f32_mask = bias && dtype != kF32 && TensorDType(*bias) == kF32;  // a 16-bit model's fp32 mask
  if (kernel == Kernel::kCluster && !f32_mask &&
      LaunchClusterAttention(op, p, dtype, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), stream)) {
    CheckCuda(cudaGetLastError(), op, "attention kernel launch");
    return;
  }
  if ((kernel == Kernel::kTile || kernel == Kernel::kCluster) &&
      LaunchTile(op, p, dtype, f32_mask, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), stream)) {
    CheckCuda(cudaGetLastError(), op, "attention kernel launch");
    return;
  }
  LaunchAttention(p, dtype, f32_mask, DataPtr(q), DataPtr(k), DataPtr(v), mp, DataPtr(y), kernel, stream);
  CheckCuda(cudaGetLastError(), op, "attention kernel launch");
}

void Sdpa(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kSdpa, q, k, v, nullptr, attrs, y, workspace);
}

void SdpaBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
              TensorView workspace) {
  SdpaImpl(kSdpaBias, q, k, v, &bias, attrs, y, workspace);
}

void Split(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kSplit, q, k, v, nullptr, attrs, y, workspace, Kernel::kSplitKey);
}

void SplitBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
               TensorView workspace) {
  SdpaImpl(kSplitBias, q, k, v, &bias, attrs, y, workspace, Kernel::kSplitKey);
}

void Tile(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kTile, q, k, v, nullptr, attrs, y, workspace, Kernel::kTile);
}

void TileBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
              TensorView workspace) {
  SdpaImpl(kTileBias, q, k, v, &bias, attrs, y, workspace, Kernel::kTile);
}

void Cluster(TensorView q, TensorView k, TensorView v, Shape attrs, TensorView y, TensorView workspace) {
  SdpaImpl(kCluster, q, k, v, nullptr, attrs, y, workspace, Kernel::kCluster);
}

void ClusterBias(TensorView q, TensorView k, TensorView v, TensorView bias, Shape attrs, TensorView y,
                 TensorView workspace) {
  SdpaImpl(kClusterBias, q, k, v, &bias, attrs, y, workspace, Kernel::kCluster);
}

}  // namespace

void LaunchSplitKeyAttention(const SdpaParams& p, int dtype, bool f32_mask, const void* q, const void* k,
                             const void* v, const void* m, void* y, cudaStream_t stream) {
  LaunchAttention(p, dtype, f32_mask, q, k, v, m, y, Kernel::kSplitKey, stream);
}

namespace {

__attribute__((constructor)) void RegisterAttention() {
  try {
    Register(kSdpa, Sdpa);
    Register(kSdpaBias, SdpaBias);
    Register(kSplit, Split);
    Register(kSplitBias, SplitBias);
    Register(kTile, Tile);
    Register(kTileBias, TileBias);
    Register(kCluster, Cluster);
    Register(kClusterBias, ClusterBias);
  } catch (const std::exception& e) {  // never let an exception escape dlopen
    std::fprintf(stderr, "tvm-nimble vendor extension: registration failed: %s\n", e.what());
  }
}

}  // namespace
}  // namespace nimble_vendor
