"""``tvm_nimble.build_training``: one training step (forward, loss, gradients, optimizer update) as one
Nimble plan.

TVM's own training transforms make the pieces: ``relax.training.SetupTrainer`` derives the loss,
its adjoint (the gradients, by TVM's Gradient pass) and the optimizer update from the model.
Here they are composed into one Relax function, ``main(inputs..., params..., labels...,
optimizer state...) -> (loss, new params..., new state...)``, with the pieces inlined, so that
stream assignment sees the whole step: the backward pass of parallel branches and the optimizer's
independent per-parameter updates become concurrent streams like any other kernels. The step then
goes through the same stages as inference: the concurrency-safe memory plan, the race checker and
the executor (one CUDA graph on a GPU).

A :class:`NimbleTrainer` runs steps: inputs and labels in, the loss out, the parameters and
optimizer state carried from one step's outputs to the next step's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.errors import NimbleError

LOSSES = ("mse", "cross_entropy")
OPTIMIZERS = ("sgd", "momentum")  # TVM 0.27's Adam fails in its own init (a numpy dtype from a TVM dtype)


def _loss(name: str):
    from tvm.relax.training.loss import CrossEntropyLoss, MSELoss

    if name == "mse":
        return MSELoss(reduction="sum")
    if name == "cross_entropy":
        return CrossEntropyLoss(reduction="sum")
    raise NimbleError(f"loss must be one of {LOSSES}, got {name!r}")


def _optimizer(name: str, lr: float):
    from tvm.relax.training.optimizer import SGD, MomentumSGD

    if name == "sgd":
        return SGD(lr)
    if name == "momentum":
        return MomentumSGD(lr, momentum=0.9)
    raise NimbleError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def _leaves(ty) -> list:
    """The tensor types of a (nested) tuple type, in order."""
    if isinstance(ty, relax.TensorType):
        return [ty]
    return [leaf for f in ty.fields for leaf in _leaves(f)]


def _rebuild(ty, leaves: list):
    """``leaves`` (Relax exprs, consumed in order) packed back into the nesting of ``ty``."""
    if isinstance(ty, relax.TensorType):
        return leaves.pop(0)
    return relax.Tuple([_rebuild(f, leaves) for f in ty.fields])


@dataclass
class TrainingStep:
    """The composed step module and what its ``main`` takes and returns, in order."""

    mod: tvm.IRModule  # main + the PrimFuncs it calls
    inputs: list[str]  # the model's data inputs
    params: dict[str, np.ndarray]  # initial values of the trained parameters
    labels: list[tuple[tuple, str]]  # (shape, dtype) per label
    state: list[np.ndarray]  # the optimizer state's initial tensors (its step count, momenta...)
    train_mod: tvm.IRModule = field(repr=False, default=None)  # SetupTrainer's output, for TVM's own Trainer
    onnx_model: object = field(repr=False, default=None)  # the model trained, for exporting its new weights


def training_step(model, loss: str = "mse", optimizer: str = "sgd", lr: float = 0.01,
                  shape_dict=None) -> TrainingStep:
    """Compose one training step of ``model`` (ONNX file or ModelProto) with TVM's training transforms."""
    from tvm.relax.training import SetupTrainer

    from .frontend.onnx_import import from_onnx_trainable

    loss_fn, optim = _loss(loss), _optimizer(optimizer, lr)  # bad names fail before the import
    from .frontend import load_onnx_model

    onnx_model = load_onnx_model(model)
    mod, params = from_onnx_trainable(onnx_model, shape_dict)
    main = mod["main"]
    n_in = len(main.params) - len(params)
    backbone = main.without_attr("params").with_attr("global_symbol", "backbone")
    mod = tvm.IRModule({"backbone": backbone}).with_attr("param_num", len(params)).with_attr("state_num", 0)
    out_ty = main.ret_ty
    if not isinstance(out_ty, relax.TensorType):
        raise NimbleError("build_training needs a model with one output tensor (the prediction the loss compares)")
    label_ty = out_ty
    if loss == "cross_entropy":  # class indices: (batch,)
        label_ty = relax.TensorType([out_ty.shape.values[0]], "int64")
    train_mod = SetupTrainer(loss_fn, optim, [out_ty, label_ty])(mod)  # also initializes optim.state
    adj_f, opt_f = train_mod["backbone_loss_adjoint"], train_mod["optimizer"]
    state_ty = opt_f.params[2].ty
    state_leaves = _leaves(state_ty)

    xs = [relax.Var(p.name, p.ty) for p in adj_f.params[:n_in]]
    ps = [relax.Var(p.name, p.ty) for p in adj_f.params[n_in:n_in + len(params)]]
    label = relax.Var("label", adj_f.params[-1].ty)
    states = [relax.Var(f"state{i}", t) for i, t in enumerate(state_leaves)]
    bb = relax.BlockBuilder(train_mod)
    adj = bb.add_func(adj_f.without_attr("global_symbol"), "step_adjoint")
    opt = bb.add_func(opt_f.without_attr("global_symbol"), "step_optimizer")
    with bb.function("main", [*xs, *ps, label, *states]):
        with bb.dataflow():
            result = bb.emit(relax.Call(adj, [*xs, *ps, label]))
            loss_v = bb.emit(relax.TupleGetItem(result, 0))
            grads = bb.emit(relax.TupleGetItem(result, 1))
            updated = bb.emit(relax.Call(opt, [relax.Tuple(ps), grads, _rebuild(state_ty, list(states))]))
            new_params = bb.emit(relax.TupleGetItem(updated, 0))
            new_state = bb.emit(relax.TupleGetItem(updated, 1))
            outs = [loss_v] + [bb.emit(relax.TupleGetItem(new_params, i)) for i in range(len(ps))]
            outs += _flatten(bb, new_state, state_ty)
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    composed = relax.transform.InlinePrivateFunctions()(bb.get())
    step = tvm.IRModule({gv: f for gv, f in composed.functions.items()
                         if not isinstance(f, relax.Function) or gv.name_hint == "main"})
    step = relax.transform.DeadCodeElimination(["main"])(step)
    return TrainingStep(step, [p.name for p in xs], dict(zip([p.name for p in ps], params)),
                        [(_shape(label.ty), str(label.ty.dtype))],
                        [s.numpy() for s in _state_leaves(optim.state)], train_mod, onnx_model)


def _state_leaves(state) -> list:
    if hasattr(state, "numpy"):
        return [state]
    return [leaf for s in state for leaf in _state_leaves(s)]


def _flatten(bb, expr, ty) -> list:
    if isinstance(ty, relax.TensorType):
        return [expr]
    return [leaf for i, f in enumerate(ty.fields) for leaf in _flatten(bb, bb.emit(relax.TupleGetItem(expr, i)), f)]


def _shape(ty) -> tuple:
    return tuple(int(d) for d in ty.shape.values)


class NimbleTrainer:
    """Training steps on a built step plan: ``loss = trainer.step(inputs, labels)``; ``trainer.params``.

    Parameters and optimizer state stay on the device: each is an output of the step that the
    executor carries into the next step's input without a copy (see
    :mod:`tvm_nimble.runtime.carry`). A step is: copy the batch in, one launch (one CUDA graph on
    a GPU), and, if asked, read the loss back."""

    def __init__(self, module, step: TrainingStep, device=None, mode: str | None = None):
        """``mode``: the executor's (``single-stream`` replays the same kernels on one stream)."""
        from tvm_nimble.runtime.executor import NimbleExecutor

        self.module = module
        self.param_names = list(step.params)
        self.num_inputs = len(step.inputs)
        self.label_spec = step.labels[0]
        self._onnx = step.onnx_model
        n_p, n_s = len(step.params), len(step.state)
        # inputs: data..., params..., label, state...; outputs: loss, params..., state...
        carried = {1 + k: self.num_inputs + k for k in range(n_p)}
        carried.update({1 + n_p + k: self.num_inputs + n_p + 1 + k for k in range(n_s)})
        self.executor = NimbleExecutor(module, device, mode=mode, carry=carried)
        for k, value in zip(carried.values(), [*step.params.values(), *step.state]):
            self.executor.set_input(k, np.asarray(value))
        self._label_index = self.num_inputs + n_p
        self._initial = {k: np.asarray(v) for k, v in step.params.items()}
        self.steps = 0

    def step(self, inputs, labels, read_loss: bool = True) -> float | None:
        """One step: forward, loss, gradients, update. Returns the loss before the update (``None``
        with ``read_loss=False``, which leaves the step running asynchronously on a GPU)."""
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        labels = list(labels) if isinstance(labels, (list, tuple)) else [labels]
        if len(inputs) != self.num_inputs:
            raise NimbleError(f"the model takes {self.num_inputs} input(s), got {len(inputs)}")
        if len(labels) != 1:
            raise NimbleError(f"the step takes one label tensor, got {len(labels)}")
        ex = self.executor
        for k, x in enumerate(inputs):
            ex.set_input(k, x)
        ex.set_input(self._label_index, labels[0])
        ex.run()
        self.steps += 1
        return float(ex.get_output(0, copy=False).numpy()) if read_loss else None

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The current parameters, copied to the host."""
        if not self.steps:
            return dict(self._initial)
        return {k: self.executor.get_output(1 + i, copy=False).numpy() for i, k in enumerate(self.param_names)}

    def export_onnx(self, path: str) -> str:
        """The trained model as ONNX: the original graph with its initializers set to the current
        parameters (deploy it with ``tvm_nimble.build`` like any model)."""
        import onnx
        from onnx import numpy_helper

        model = onnx.ModelProto()
        model.CopyFrom(self._onnx)
        params = self.params
        found = set()
        for init in model.graph.initializer:
            if init.name in params:
                init.CopyFrom(numpy_helper.from_array(params[init.name].astype(numpy_helper.to_array(init).dtype),
                                                      init.name))
                found.add(init.name)
        missing = sorted(set(params) - found)
        if missing:
            raise NimbleError(f"cannot export: trained parameter(s) {missing[:3]} are not initializers of the ONNX model")
        onnx.save(model, path)
        return path


def build_training(model, target="llvm", *, loss: str = "mse", optimizer: str = "sgd", lr: float = 0.01,
                   max_streams="auto", shape_dict=None, device=None) -> NimbleTrainer:
    """Build one training step of ``model`` with Nimble (see the module docstring) and return its trainer.

    ``loss``: "mse" (labels shaped like the output) or "cross_entropy" (int64 class indices, one per
    batch row); ``optimizer``: "sgd" or "momentum" (0.9), with learning rate ``lr``. Kernels are TVM's
    (vendor backward kernels are not offloaded yet)."""
    from .build import build

    step = training_step(model, loss, optimizer, lr, shape_dict)
    module = build(step.mod, target, max_streams=max_streams, kernels="tvm")
    return NimbleTrainer(module, step, device)
