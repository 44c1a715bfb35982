"""The compile side: ONNX frontend, target resolution, ``build`` (passes -> plan -> kernels), the
registered TVM pipeline, ``explain``, tuning, and the stock-TVM build used as the reference.

Rule: this is the only package that wires the stages (``relay_passes`` -> ``codegen``) together,
and one :class:`~tvm_nimble.compiler.build.BuildResult` is what every consumer reuses. It may
import ``tvm.relax``; the runtime never imports anything from here.
"""
