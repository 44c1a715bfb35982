"""The runtime: load a plan and replay it. Deploy machines need only this package.

Rule: modules here import the TVM *runtime* (``tvm.runtime``, ``tvm_ffi``), numpy and
``cuda.bindings``, never ``tvm.relax`` nor any compiler-side module of this project, so an
artifact directory or a ``relax_pipeline="nimble"`` executable loads where only the TVM
runtime is installed (``tests/test_runtime_only.py`` checks both).
"""
