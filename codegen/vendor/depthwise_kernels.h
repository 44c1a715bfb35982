// The depthwise / pool stencil kernels (described at the top of depthwise.cu) and their launches, shared by the
// units that instantiate them for one dtype each (depthwise_f32.cu, depthwise_f16.cu, depthwise_bf16.cu: they compile
// side by side, where one unit of every dtype was the extension's slowest convolution-net unit).
#pragma once

#include <cstdlib>
#include <type_traits>

#include "common.h"

namespace nimble_vendor {

enum Mode : int { kDwConv = 0, kAvgValid = 1, kAvgAll = 2, kMax = 3 };

// The epilogue's activation codes compiled in: the call takes 0-2 (depthwise.cu checks), and the kernels keep the code
// they were measured with (0-3): a branch added to Activate, even one never taken, moved their register counts.
constexpr int kStencilMaxActivation = 3;

struct StencilParams {
  int n, h, w, c, oh, ow;
  int kh, kw, sh, sw, pt, pl, dh, dw;
  int act, relu_input;
};

// The stencil of `mode` (Mode) over x in `layout` (1: NHWC, 0: NCHW) into y, on `stream`, for one dtype each;
// w, b, z may be null (a pool; no residual).
void LaunchStencilF32(int mode, int layout, const void* x, const void* w, const void* b, const void* z, void* y,
                      const StencilParams& p, cudaStream_t s);
void LaunchStencilF16(int mode, int layout, const void* x, const void* w, const void* b, const void* z, void* y,
                      const StencilParams& p, cudaStream_t s);
void LaunchStencilBF16(int mode, int layout, const void* x, const void* w, const void* b, const void* z, void* y,
                       const StencilParams& p, cudaStream_t s);

namespace {

constexpr int kThreads = 256;
constexpr int kMinThreads = 64;  // the smallest block BlockThreads gives a small layer

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// One tap of the window, without a branch around it: a tap outside the input has loaded a clamped (valid) address
// and is masked out here. With the window unrolled, all of its loads then issue back to back instead of one L2
// round trip per tap (a 7 x 7 window took 49 of them, 12 us for a 21 x 21 x 336 layer).
template <int MODE>
__device__ __forceinline__ float Tap(float acc, float a, float w, bool inside, int relu_input) {
  if (relu_input) a = fmaxf(a, 0.0f);
  if (MODE == kDwConv) return fmaf(inside ? a : 0.0f, w, acc);
  if (MODE == kMax) return inside ? fmaxf(acc, a) : acc;
  return acc + (inside ? a : 0.0f);
}

// tap(r, s) over the window: unrolled when K > 0 (its size known at compile time), else kh x kw at run time.
template <int K, typename F>
__device__ __forceinline__ void ForWindow(int kh, int kw, F&& tap) {
  if constexpr (K > 0) {
#pragma unroll
    for (int r = 0; r < K; ++r) {
#pragma unroll
      for (int s = 0; s < K; ++s) tap(r, s);
    }
  } else {
    for (int r = 0; r < kh; ++r) {
      for (int s = 0; s < kw; ++s) tap(r, s);
    }
  }
}

// Channels-last: thread -> (pixel, vector of V channels); consecutive threads read consecutive channel vectors of
// one pixel, then the next pixel's. K > 0: a K x K window known at compile time (3, 5, 7), so the taps unroll and
// their loads issue together.
template <typename T, int V, int MODE, int K>
__global__ void __launch_bounds__(kThreads) StencilNhwc(const T* __restrict__ x, const T* __restrict__ w,
                                                        const T* __restrict__ b, const T* __restrict__ z,
                                                        T* __restrict__ y, StencilParams p) {
  const int cv = p.c / V;
  const int64_t total = int64_t(p.n) * p.oh * p.ow * cv;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int c0 = int(idx % cv) * V;
  int64_t pix = idx / cv;
  const int ox = int(pix % p.ow);
  pix /= p.ow;
  const int oy = int(pix % p.oh);
  const int n = int(pix / p.oh);
  const int kh = K > 0 ? K : p.kh, kw = K > 0 ? K : p.kw;
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = MODE == kMax ? -INFINITY : 0.0f;
  int taps = 0;
  const int iy0 = oy * p.sh - p.pt, ix0 = ox * p.sw - p.pl;
  const T* xn = x + int64_t(n) * p.h * p.w * p.c + c0;
  auto tap = [&](int r, int s) {
    const int iy = iy0 + r * p.dh, ix = ix0 + s * p.dw;
    const bool inside = iy >= 0 && iy < p.h && ix >= 0 && ix < p.w;
    const int cy = min(max(iy, 0), p.h - 1), cx = min(max(ix, 0), p.w - 1);
    const Pack<T, V> xv = *reinterpret_cast<const Pack<T, V>*>(xn + (int64_t(cy) * p.w + cx) * p.c);
    Pack<T, V> wv;
    if (MODE == kDwConv) wv = *reinterpret_cast<const Pack<T, V>*>(w + (r * kw + s) * p.c + c0);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      acc[q] = Tap<MODE>(acc[q], ToF(xv.v[q]), MODE == kDwConv ? ToF(wv.v[q]) : 0.0f, inside, p.relu_input);
    }
    taps += inside;
  };
  ForWindow<K>(kh, kw, tap);
  const float scale = MODE == kAvgValid ? 1.0f / float(max(taps, 1)) : MODE == kAvgAll ? 1.0f / float(kh * kw) : 1.0f;
  const int64_t out = idx * V;  // (pixel, c0) in NHWC order is exactly idx * V
  Pack<T, V> bv, zv, yv;
  if (b != nullptr) bv = *reinterpret_cast<const Pack<T, V>*>(b + c0);
  if (z != nullptr) zv = *reinterpret_cast<const Pack<T, V>*>(z + out);
#pragma unroll
  for (int q = 0; q < V; ++q) {
    float v = MODE == kDwConv ? acc[q] : acc[q] * scale;
    if (b != nullptr) v += ToF(bv.v[q]);
    if (z != nullptr) v += ToF(zv.v[q]);
    yv.v[q] = FromF<T>(Activate<kStencilMaxActivation>(v, p.act));
  }
  *reinterpret_cast<Pack<T, V>*>(y + out) = yv;
}

// Channels-first (exact fp32 builds keep NCHW): a thread per output element, consecutive threads along a row. K as
// in StencilNhwc.
template <typename T, int MODE, int K>
__global__ void __launch_bounds__(kThreads) StencilNchw(const T* __restrict__ x, const T* __restrict__ w,
                                                        const T* __restrict__ b, const T* __restrict__ z,
                                                        T* __restrict__ y, StencilParams p) {
  const int64_t total = int64_t(p.n) * p.c * p.oh * p.ow;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int ox = int(idx % p.ow);
  int64_t t = idx / p.ow;
  const int oy = int(t % p.oh);
  t /= p.oh;
  const int c = int(t % p.c);
  const int n = int(t / p.c);
  const int kh = K > 0 ? K : p.kh, kw = K > 0 ? K : p.kw;
  const T* xc = x + (int64_t(n) * p.c + c) * p.h * p.w;
  float acc = MODE == kMax ? -INFINITY : 0.0f;
  int taps = 0;
  const int iy0 = oy * p.sh - p.pt, ix0 = ox * p.sw - p.pl;
  auto tap = [&](int r, int s) {
    const int iy = iy0 + r * p.dh, ix = ix0 + s * p.dw;
    const bool inside = iy >= 0 && iy < p.h && ix >= 0 && ix < p.w;
    const float a = ToF(xc[min(max(iy, 0), p.h - 1) * p.w + min(max(ix, 0), p.w - 1)]);
    acc = Tap<MODE>(acc, a, MODE == kDwConv ? ToF(w[(r * kw + s) * p.c + c]) : 0.0f, inside, p.relu_input);
    taps += inside;
  };
  ForWindow<K>(kh, kw, tap);
  float v = MODE == kAvgValid ? acc / float(max(taps, 1)) : MODE == kAvgAll ? acc / float(kh * kw) : acc;
  if (b != nullptr) v += ToF(b[c]);
  if (z != nullptr) v += ToF(z[idx]);
  y[idx] = FromF<T>(Activate<kStencilMaxActivation>(v, p.act));
}

// Threads per block: 256, unless that leaves SMs idle (a batch-1 layer of 11 x 11 x 672 is 40 such blocks); then
// down to kMinThreads, so the same threads spread over more SMs.
inline unsigned BlockThreads(int64_t total) {
  unsigned threads = kThreads;
  while (threads > kMinThreads && (total + threads - 1) / threads < int64_t(SmCount())) threads /= 2;
  return threads;
}

// launch(std::integral_constant<int, K>) with the K a window of p's size is compiled for (see StencilNhwc).
template <int MODE, typename F>
void WithWindow(const StencilParams& p, F&& launch) {
  const int k = p.kh == p.kw ? p.kh : 0;
  if constexpr (MODE == kDwConv) {  // NASNet's separable convolutions are 3x3, 5x5 and 7x7
    if (k == 5) return launch(std::integral_constant<int, 5>{});
    if (k == 7) return launch(std::integral_constant<int, 7>{});
  }
  if (k == 3) launch(std::integral_constant<int, 3>{});
  else launch(std::integral_constant<int, 0>{});
}

// kernel over `total` threads, in blocks of BlockThreads(total).
template <typename T, typename Kernel>
void LaunchStencil(Kernel kernel, int64_t total, const void* x, const void* w, const void* b, const void* z, void* y,
                   const StencilParams& p, cudaStream_t s) {
  const unsigned threads = BlockThreads(total), blocks = unsigned((total + threads - 1) / threads);
  kernel<<<blocks, threads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
                                    static_cast<const T*>(z), static_cast<T*>(y), p);
}

template <typename T, int V, int MODE>
void LaunchNhwcV(const void* x, const void* w, const void* b, const void* z, void* y, const StencilParams& p,
                 cudaStream_t s) {
  const int64_t total = int64_t(p.n) * p.oh * p.ow * (p.c / V);
  WithWindow<MODE>(p, [&](auto k) {
    LaunchStencil<T>(StencilNhwc<T, V, MODE, decltype(k)::value>, total, x, w, b, z, y, p, s);
  });
}

// The vector of channels a thread takes: the widest (up to 16 bytes) that divides C and that every pointer is
// aligned to, unless that leaves SMs idle even in blocks of 64 threads (BlockThreads); then 2 channels a thread,
// for 4x the threads. NIMBLE_DEPTHWISE_VECTOR=1|2|4|8 forces a width (elements;
// depthwise_check times them).
template <typename T, int MODE>
void LaunchNhwc(const void* x, const void* w, const void* b, const void* z, void* y, const StencilParams& p,
                cudaStream_t s) {
  uint32_t align = std::min({PtrAlign(x), PtrAlign(y), w ? PtrAlign(w) : 256u, b ? PtrAlign(b) : 256u,
                             z ? PtrAlign(z) : 256u});
  auto fits = [&](int v) { return p.c % v == 0 && align % (v * sizeof(T)) == 0; };
  constexpr int kWide = 16 / sizeof(T);  // 4 floats, 8 halves
  const int64_t pixels = int64_t(p.n) * p.oh * p.ow;
  int v = fits(kWide) ? kWide : fits(2) ? 2 : 1;
  if (v == kWide && pixels * (p.c / v) < int64_t(SmCount()) * kMinThreads && fits(2)) v = 2;
  if (const char* env = std::getenv("NIMBLE_DEPTHWISE_VECTOR")) {
    const int forced = std::atoi(env);
    if ((forced == kWide || forced == 2 || forced == 1) && fits(forced)) v = forced;
  }
  if (v == kWide) LaunchNhwcV<T, kWide, MODE>(x, w, b, z, y, p, s);
  else if (v == 2) LaunchNhwcV<T, 2, MODE>(x, w, b, z, y, p, s);
  else LaunchNhwcV<T, 1, MODE>(x, w, b, z, y, p, s);
}

template <typename T, int MODE>
void LaunchNchw(const void* x, const void* w, const void* b, const void* z, void* y, const StencilParams& p,
                cudaStream_t s) {
  const int64_t total = int64_t(p.n) * p.c * p.oh * p.ow;
  WithWindow<MODE>(p, [&](auto k) {
    LaunchStencil<T>(StencilNchw<T, MODE, decltype(k)::value>, total, x, w, b, z, y, p, s);
  });
}

template <typename T>
void LaunchTyped(int mode, int layout, const void* x, const void* w, const void* b, const void* z, void* y,
                 const StencilParams& p, cudaStream_t s) {
  if (layout == 1) {
    if (mode == kDwConv) LaunchNhwc<T, kDwConv>(x, w, b, z, y, p, s);
    else if (mode == kAvgValid) LaunchNhwc<T, kAvgValid>(x, w, b, z, y, p, s);
    else if (mode == kAvgAll) LaunchNhwc<T, kAvgAll>(x, w, b, z, y, p, s);
    else LaunchNhwc<T, kMax>(x, w, b, z, y, p, s);
  } else {
    if (mode == kDwConv) LaunchNchw<T, kDwConv>(x, w, b, z, y, p, s);
    else if (mode == kAvgValid) LaunchNchw<T, kAvgValid>(x, w, b, z, y, p, s);
    else if (mode == kAvgAll) LaunchNchw<T, kAvgAll>(x, w, b, z, y, p, s);
    else LaunchNchw<T, kMax>(x, w, b, z, y, p, s);
  }
}

}  // namespace
}  // namespace nimble_vendor
