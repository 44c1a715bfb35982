// The cuDNN frontend's handle to cuDNN, for the units that use the frontend (cudnn_attention.cpp,
// cudnn_conv_graph.cpp). The frontend is built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (see
// codegen/vendor_build.py) and finds cuDNN's functions through this handle: the libcudnn.so.9 this extension is
// linked against. Defined weak in each unit that includes it (the link keeps one), so that either unit builds
// and links without the other.
#pragma once

#include <cudnn_frontend.h>
#include <dlfcn.h>

namespace cudnn_frontend {
__attribute__((weak)) void* cudnn_dlhandle = [] {
  void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
  return h ? h : RTLD_DEFAULT;
}();
}  // namespace cudnn_frontend
