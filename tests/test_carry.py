"""Carried state (an output that becomes the next run's input, buffers trading roles each run)
against the same recurrence computed with numpy, and the refusals of pairs that cannot trade."""
import numpy as np
import pytest
from tvm.script import ir as I, relax as R

from tvm_nimble import NimbleExecutor
from tvm_nimble.compiler.build import build
from tvm_nimble.runtime.carry import CarryError


@I.ir_module
class Recurrence:
    @R.function
    def main(x: R.Tensor((8,), "float32"), h: R.Tensor((8,), "float32"), c: R.Tensor((8,), "float32")):
        with R.dataflow():
            a = R.add(R.multiply(h, R.const(0.5, "float32")), x)  # h' = h/2 + x
            b = R.add(c, R.nn.relu(h))  # c' = c + relu(h)
            y = R.multiply(a, b)
            out = (y, a, b)
            R.output(out)
        return out


def _numpy(xs, h, c):
    ys = []
    for x in xs:
        h, c = h * 0.5 + x, c + np.maximum(h, 0)
        ys.append(h * c)
    return ys, h, c


@pytest.fixture(scope="module")
def recurrence():
    return build(Recurrence, "llvm")


def test_carried_state_follows_the_recurrence(recurrence):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(8).astype("float32") for _ in range(5)]
    h0, c0 = rng.standard_normal(8).astype("float32"), rng.standard_normal(8).astype("float32")
    ex = NimbleExecutor(recurrence, carry={1: "h", 2: 2})
    ex.set_input("h", h0)
    ex.set_input("c", c0)
    ys = []
    for x in xs:  # only x is given each run; h and c come from the run before, no copy
        ex.set_input("x", x)
        ex.run()
        ys.append(ex.get_output(0).numpy())
    ref_ys, ref_h, ref_c = _numpy(xs, h0, c0)
    for y, r in zip(ys, ref_ys):
        np.testing.assert_allclose(y, r, rtol=1e-6)
    np.testing.assert_allclose(ex.get_output(1).numpy(), ref_h, rtol=1e-6)
    np.testing.assert_allclose(ex.get_output(2).numpy(), ref_c, rtol=1e-6)
    # the state moves (an even and an odd number of runs would otherwise look alike)
    assert not np.allclose(ys[-1], ys[-2])


def test_state_set_between_runs_is_what_the_next_run_reads(recurrence):
    ex = NimbleExecutor(recurrence, carry={1: "h", 2: "c"})
    x = np.ones(8, "float32")
    ex(x, np.zeros(8, "float32"), np.zeros(8, "float32"))  # one run: the parity has flipped
    h, c = np.full(8, 2.0, "float32"), np.full(8, -1.0, "float32")
    ex.set_input("h", h)
    ex.set_input("c", c)
    ex.set_input("x", x)
    ex.run()
    ys, _, _ = _numpy([x], h, c)
    np.testing.assert_allclose(ex.get_output(0).numpy(), ys[0], rtol=1e-6)


@pytest.mark.parametrize("carry,match", [
    ({0: "x", 1: "x"}, "named twice"),
    ({1: "missing"}, "unknown input 'missing'"),
    ({7: "h"}, "output index 7 out of range"),
    ({1: 5}, "input index 5 out of range"),
])
def test_pairs_that_cannot_trade_are_one_clear_error(recurrence, carry, match):
    with pytest.raises(CarryError, match=match):
        NimbleExecutor(recurrence, carry=carry)


@I.ir_module
class Mismatched:
    @R.function
    def main(x: R.Tensor((4,), "float32"), s: R.Tensor((2,), "float32")):
        with R.dataflow():
            y = R.add(x, R.sum(s))
            out = (y, s)  # output 1 is the input s itself, not a buffer of its own
            R.output(out)
        return out


def test_shape_mismatch_and_passthrough_are_refused():
    module = build(Mismatched, "llvm")
    with pytest.raises(CarryError, match=r"output 0 is float32\[4\] but input 's' is float32\[2\]"):
        NimbleExecutor(module, carry={0: "s"})
    with pytest.raises(CarryError, match="output 1 is not a buffer of its own"):
        NimbleExecutor(module, carry={1: "s"})


def test_an_input_a_kernel_writes_cannot_be_carried():
    """A plan whose first kernel halves the input h in place (no build emits one: the checker refuses a
    written input, but a loaded plan can hold anything). The buffer swap is argued safe only for inputs
    that no launch writes (see tvm_nimble.runtime.carry), so such an input is refused, in one line."""
    from tvm_nimble.runtime.module import NimbleModule
    from tvm_nimble.contract.plan import Launch, Plan, Storage, TensorSlot

    def halve_in_place(h):
        h.copyfrom(h.numpy() / 2)

    def add(a, b, out):
        out.copyfrom(a.numpy() + b.numpy())

    tensors = [TensorSlot(0, "x", [8], "float32", "input", 0), TensorSlot(1, "h", [8], "float32", "input", 1),
               TensorSlot(2, "y", [8], "float32", "output", 2)]
    plan = Plan(target={"kind": "llvm"}, num_streams=1, num_events=0, tensors=tensors,
                storages=[Storage(0, 32, "input"), Storage(1, 32, "input"), Storage(2, 32, "output")],
                launches=[Launch(0, "halve_in_place", [1], [1], 0), Launch(1, "add", [1, 0, 2], [2], 0)],
                inputs=[0, 1], outputs=[2], constants=[])
    plan.validate()
    module = NimbleModule(plan, {"halve_in_place": halve_in_place, "add": add}, {})
    x, h = np.arange(8, dtype="float32"), np.full(8, 4.0, "float32")
    np.testing.assert_allclose(NimbleExecutor(module)(x, h)[0].numpy(), h / 2 + x)  # the plan itself runs
    with pytest.raises(CarryError, match="carry: input 'h' is written by a kernel, so it cannot become an output "
                                         "buffer") as err:
        NimbleExecutor(module, carry={0: "h"})
    assert "\n" not in str(err.value)
