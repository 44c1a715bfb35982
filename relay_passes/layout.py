"""The activation layout of a build: NCHW as the model has it, or NHWC for the convolutions and what runs between them.

Why NHWC: cuDNN's tensor-core convolutions (TF32, fp16, bf16) read channels-last data. In NCHW they transpose or
take slower kernels (torch.compile's layout optimization turns a convolutional net channels-last for the same
reason). Exact fp32 (FMA kernels) gains nothing from channels-last, so ``auto`` keeps it NCHW (see
benchmarks/findings.md, 'Channels-last builds: every tensor-core precision').

The change is TVM's ``ConvertLayout``: every conv2d becomes NHWC / OHWI, pools follow, element-wise operators and
reductions propagate the layout, and one ``permute_dims`` stands where the graph enters or leaves it (the model's
input, a reshape before the classifier). Weights are constants, so their permutation folds away here: the layout
changes once per boundary, not per operator. Inputs and outputs keep the model's layout.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .clip_ops import ClipAsOperators, clip_as_min_max
from .fold_constants import BatchedFoldConstant

#: ``layout`` of a build: the model's (``nchw``), channels-last (``nhwc``), or ``auto`` (``BuildOptions.data_layout``)
LAYOUTS = ("auto", "nchw", "nhwc")

#: what ConvertLayout is asked for: the convolution's data and kernel layouts (pools, element-wise operators and
#: reductions take their input's layout; TVM refuses a desired layout for a pool)
NHWC_LAYOUTS = {"relax.nn.conv2d": ["NHWC", "OHWI"]}


def has_conv2d(mod: tvm.IRModule) -> bool:
    """Whether ``main`` has an NCHW conv2d (what a layout change is for)."""
    found = []

    def visit(e):
        if (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.conv2d"
                and e.attrs.data_layout == "NCHW"):
            found.append(e)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return bool(found)


def to_nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its convolutions and pools in NHWC, the permutations of constants folded."""
    if not has_conv2d(mod):
        return mod
    # ConvertLayout has no rule for clip (ReLU6): as maximum / minimum it moves with the rest, and is a clip again
    mod = ClipAsOperators(relax.transform.ConvertLayout(NHWC_LAYOUTS)(clip_as_min_max(mod)))
    return tvm.transform.Sequential([BatchedFoldConstant(), relax.transform.FoldConstant()])(mod)
