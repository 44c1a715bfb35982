import time, sys, os
from tvm_nimble.codegen.vendor_build import build_vendor_library
from tvm_nimble.codegen.compile_cache import records
t = time.time()
build_vendor_library("sm_90")
print("whole extension", round(time.time() - t, 1), "s, jobs", os.environ.get("TVM_NIMBLE_JOBS"))
for r in sorted(records(os.environ["TVM_NIMBLE_CACHE_DIR"]), key=lambda r: r.started):
    print(f"{r.started - t:7.1f} {r.seconds:6.1f} {r.what}")
