"""ONNX Gathers as clipping takes (relay_passes/take_indices.py): the same outputs as the ONNX reference evaluator,
and no TVM warning about fast-mode takes on the stderr of a Python API build."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from tvm import relax

from tvm_nimble.compiler.stages import import_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _embedding(vocab: int = 11, dim: int = 4) -> onnx.ModelProto:
    """y = table[ids] (a Gather on axis 0, as an embedding lookup exports) + a Gather of a negative index."""
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((vocab, dim)).astype(np.float32), "table")
    last = numpy_helper.from_array(np.array(-1, dtype=np.int64), "last")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
         helper.make_node("Gather", ["table", "last"], ["row"], axis=0),
         helper.make_node("Add", ["e", "row"], ["y"])], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, dim])], initializer=[table, last])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _take_modes(mod) -> list[str]:
    modes = []

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", None) == "relax.take":
            modes.append(str(e.attrs.mode))

    relax.analysis.post_order_visit(mod["main"], visit)
    return modes


def test_imported_gathers_clip_and_match_the_reference():
    from tvm_nimble import NimbleExecutor, build

    model = _embedding()
    modes = _take_modes(import_model(model))
    assert modes and "fast" not in modes
    ids = np.array([[0, 3, 10, 7, 3]], dtype=np.int64)
    want = ReferenceEvaluator(model).run(None, {"ids": ids})[0]
    with NimbleExecutor(build(model, "llvm")) as ex:
        got = ex(ids=ids)[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_python_api_build_prints_no_fast_mode_warning(tmp_path):
    """TVM logs its warning from C++ straight to file descriptor 2: a child process's stderr holds every line."""
    path = tmp_path / "embed.onnx"
    onnx.save(_embedding(), str(path))
    code = textwrap.dedent(f"""
        import tvm_nimble
        tvm_nimble.build({str(path)!r}, "llvm")
        print("built")
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, TVM_NIMBLE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "built" in r.stdout, r.stderr
    assert "Fast mode" not in r.stderr, r.stderr
