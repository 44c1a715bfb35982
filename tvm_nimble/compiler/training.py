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

import math
import re
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_nimble.errors import ModelError, NimbleError, TrainingDivergedError

from .optimizers import make_optimizer

LOSSES = ("mse", "cross_entropy")
#: the precisions a step computes in: bf16 runs the forward and backward convolutions and GEMMs in bfloat16
#: under the inference policy (relay_passes.precision) with float32 master weights, gradients and optimizer
#: state; fp16 would need loss scaling (its gradients underflow), which is not written
TRAINING_PRECISIONS = ("fp32", "tf32", "bf16")


def _loss(name: str):
    from tvm.relax.training.loss import CrossEntropyLoss, MSELoss

    if name == "mse":  # the mean over every element, as PyTorch's MSELoss (a sum grows with the output's size)
        return MSELoss(reduction="mean")
    if name == "cross_entropy":
        return CrossEntropyLoss(reduction="sum")
    raise NimbleError(f"loss must be one of {LOSSES}, got {name!r}")


def _check_lr(lr) -> float:
    """``lr`` as a float, refused unless positive and finite: a zero rate never moves the weights and a
    negative one climbs the loss to inf, both without any error of their own."""
    try:
        value = float(lr)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise NimbleError(f"the learning rate must be a positive number, got {lr!r}: pass e.g. lr=0.01")
    return value


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
    lr: float | None = None  # the optimizer's learning rate (named when the loss diverges)
    precision: str = "fp32"  # what the forward and backward passes compute in (see TRAINING_PRECISIONS)


def _training_precision(precision: str) -> str:
    from tvm_nimble.relay_passes.precision import precision_name

    try:
        name = precision_name(precision)
    except ValueError:
        name = None
    if name not in TRAINING_PRECISIONS:
        why = ("fp16 training needs loss scaling, which is not written: use bf16" if name == "fp16"
               else f"precision must be one of {', '.join(TRAINING_PRECISIONS)}, got {precision!r}")
        raise NimbleError(f"a training step cannot compute in {precision!r}: {why}")
    return name


def training_step(model, loss: str = "mse", optimizer: str = "sgd", lr: float = 0.01,
                  shape_dict=None, weight_decay: float | None = None, precision: str = "fp32") -> TrainingStep:
    """Compose one training step of ``model`` (ONNX file or ModelProto) with TVM's training transforms and
    ``optimizer`` (see :mod:`.optimizers`; ``weight_decay`` None: PyTorch's default for it), computing in
    ``precision`` (:data:`TRAINING_PRECISIONS`; the weights, their gradients and the optimizer stay float32)."""
    from tvm.relax.training import SetupTrainer

    from .frontend.onnx_import import one_line, from_onnx_trainable

    lr = _check_lr(lr)
    loss_fn, optim = _loss(loss), make_optimizer(optimizer, lr, weight_decay)  # bad values fail before the import
    precision = _training_precision(precision)
    from .frontend import load_onnx_model

    onnx_model = load_onnx_model(model)
    mod, params = from_onnx_trainable(onnx_model, shape_dict)
    n_in = len(mod["main"].params) - len(params)
    # integer initializers (Reshape shapes, Gather indices, axes) are not weights, and TVM's Gradient
    # pass refuses a non-float parameter: they become constants, the float ones are trained
    fixed = {v: tvm.runtime.tensor(w) for v, w in zip(mod["main"].params[n_in:], params) if w.dtype.kind != "f"}
    if fixed:
        mod = relax.transform.BindParams("main", fixed)(mod)
        params = [w for w in params if w.dtype.kind == "f"]
        if not params:
            raise ModelError("the model has no floating-point weights to train")
    if precision == "bf16":  # the forward pass in bfloat16; the weights stay float32 inputs (the master copy)
        from tvm_nimble.relay_passes.precision import to_precision

        mod = to_precision(mod, "bfloat16")
    main = mod["main"]
    backbone = main.without_attr("params").with_attr("global_symbol", "backbone")
    # the kernels the importer made (call_tir of TE functions) stay beside the backbone that calls them
    kernels = {gv: f for gv, f in mod.functions.items() if not isinstance(f, relax.Function)}
    mod = tvm.IRModule({**kernels, "backbone": backbone}).with_attr("param_num", len(params)).with_attr("state_num", 0)
    out_ty = main.ret_ty
    if not isinstance(out_ty, relax.TensorType):
        raise NimbleError("build_training needs a model with one output tensor (the prediction the loss compares)")
    found = _untrainable(relax.transform.DecomposeOpsForTraining("backbone")(mod)["backbone"], n_in)
    if found:
        raise _untrainable_error(found, onnx_model)
    label_ty = out_ty
    if loss == "cross_entropy":  # class indices: (batch,)
        label_ty = relax.TensorType([out_ty.shape.values[0]], "int64")
    try:
        # not legalized here: the step keeps Relax's operators (conv2d_transpose, ...) for the kernel providers,
        # and the build legalizes what none takes
        train_mod = SetupTrainer(loss_fn, optim, [out_ty, label_ty], legalize=False)(mod)  # also sets optim.state
    except Exception as err:  # noqa: BLE001  (what the check above does not foresee fails deep in TVM's passes)
        why = type(err).__name__ + (f": {one_line(err)}" if str(err).strip() else "")
        raise ModelError(f"TVM {tvm.__version__}'s training transforms (relax.training.SetupTrainer) failed on this "
                         f"model: {why}; simplify the model, or train it elsewhere and deploy it with tvm-nimble "
                         "compile") from err
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
                        [s.numpy() for s in _state_leaves(optim.state)], train_mod, onnx_model, lr, precision)


# ---- what TVM's gradient cannot train ------------------------------------------------------------
#: the ONNX operator each Relax operation comes from, where the names differ (else they match,
#: relax.erf and Erf, relax.nn.leakyrelu and LeakyRelu, ...)
_ONNX_OPS = {"relax.take": ("Gather",), "relax.strided_slice": ("Slice",), "relax.max": ("ReduceMax",),
             "relax.min": ("ReduceMin",), "relax.prod": ("ReduceProd",)}
#: the ONNX operators the importer turns into TE kernels (a call_tir of a function named after the TOPI op)
_ONNX_KERNELS = {"maximum": ("Clip",), "minimum": ("Clip",), "pad": ("Pad",), "mirror_pad": ("Pad",),
                 "replicate_pad": ("Pad",), "circular_pad": ("Pad",), "tile": ("Tile",), "flip": ("CumSum",),
                 "einsum": ("Einsum",)}


def _has_float(ty) -> bool:
    if isinstance(ty, relax.TensorType):
        return str(ty.dtype).startswith(("float", "bfloat"))
    return isinstance(ty, relax.TupleType) and any(_has_float(f) for f in ty.fields)


def _untrainable(func: relax.Function, n_in: int) -> list[tuple[str, str]]:
    """(Relax operation, detail) of every operation with a float result that a trained parameter
    reaches and that TVM's training transforms cannot take: one without a registered gradient (FPrimalGradient; the
    Gradient pass stops at the first with an InternalError), a TE kernel (call_tir; detail: its
    function's name), or a take (ONNX Gather) of a trained value on indices that are not 1-D (detail
    "nd"): TVM lowers take's gradient for 1-D indices only, and fails deep in LegalizeOps with a bare
    AssertionError. ``func``: the backbone as SetupTrainer differentiates it (DecomposeOpsForTraining)."""
    reached = set(func.params[n_in:])
    found = []
    for block in func.body.blocks:
        for b in block.bindings:
            if not any(v in reached for v in relax.analysis.free_vars(b.value)):
                continue
            reached.add(b.var)
            call = b.value
            # no gradient flows into an integer or boolean result (the isnan of a trained Clip bound)
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)) or not _has_float(b.var.ty):
                continue
            op = call.op.name
            if op == "relax.call_tir":
                found.append((op, re.sub(r"\d+$", "", call.args[0].name_hint)))
            elif call.op.get_attr("FPrimalGradient") is None:
                found.append((op, ""))
            elif op == "relax.take" and call.args[0] in reached and call.args[1].ty.ndim != 1:
                found.append((op, "nd"))
    return found


def _reached_nodes(model) -> tuple[list, set, dict]:
    """(the ONNX nodes a float initializer reaches, in order; the values it reaches; each value's rank
    where known)."""
    import onnx

    graph = model.graph
    reached = {i.name for i in graph.initializer if onnx.helper.tensor_dtype_to_np_dtype(i.data_type).kind == "f"}
    ranks = {i.name: len(i.dims) for i in graph.initializer}
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (ranks only sharpen the node names; the graph's own ones remain)
        inferred = graph
    for vi in [*graph.input, *graph.output, *inferred.value_info]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    nodes = []
    for node in graph.node:
        if any(i in reached for i in node.input):
            nodes.append(node)
            reached.update(node.output)
    return nodes, reached, ranks


def _untrainable_error(found: list[tuple[str, str]], model) -> ModelError:
    """One line naming the ONNX operators (and nodes) behind ``found`` and what to do."""
    nodes, reached, ranks = _reached_nodes(model)
    groups: dict[str, list[str]] = {}
    for op, detail in dict.fromkeys(found):
        if op == "relax.call_tir":
            types = _ONNX_KERNELS.get(detail, ())
        else:
            short = op.rsplit(".", 1)[-1].replace("_", "")
            types = _ONNX_OPS.get(op) or tuple({n.op_type for n in nodes if n.op_type.lower() == short})
        names = [n.name or f"<unnamed, output {n.output[0]!r}>" for n in nodes if n.op_type in types
                 and (detail != "nd" or (n.input[0] in reached and ranks.get(n.input[1]) != 1))]
        if detail == "nd":
            label = "Gather on indices that are not 1-D"
        elif types:
            label = "/".join(sorted(types))
        else:  # an operation this table does not trace to its ONNX operator: its Relax name
            label = f"{op}({detail})" if detail else op
        groups.setdefault(label, [])
        groups[label] += [n for n in names if n not in groups[label]]
    parts = []
    for label, names in groups.items():
        shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{label} (node{'s' if len(names) > 1 else ''} {shown})" if names else label)
    hint = " (for an embedding: a Gather on 1-D indices, then a Reshape)" if any("Gather" in p for p in parts) else ""
    return ModelError(f"cannot train this model: TVM {tvm.__version__}'s gradient cannot differentiate "
                      f"{'; '.join(parts)}; rewrite those nodes with operators it can differentiate{hint}, or train "
                      "the model elsewhere and deploy it with tvm-nimble compile")


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
        from tvm_nimble.runtime.loading import NimbleExecutor

        self.module = module
        self.param_names = list(step.params)
        self.num_inputs = len(step.inputs)
        self.label_spec = step.labels[0]
        self._onnx = step.onnx_model
        self.lr = step.lr
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
        with ``read_loss=False``, which leaves the step running asynchronously on a GPU). A loss that
        is inf or nan raises :class:`~tvm_nimble.errors.TrainingDivergedError` (checked only when read)."""
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
        if not read_loss:
            return None
        loss = float(ex.get_output(0, copy=False).numpy())
        if not math.isfinite(loss):  # every later step would be nan too, and the weights are already lost
            lr = f" (lr={self.lr:g})" if self.lr else ""
            raise TrainingDivergedError(f"the loss is {loss} at step {self.steps}: the training diverged; lower the "
                                        f"learning rate{lr} or check the inputs and labels for inf/nan")
        return loss

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
                   weight_decay: float | None = None, precision: str = "fp32", max_streams="auto",
                   kernels: str = "auto", shape_dict=None, device=None) -> NimbleTrainer:
    """Build one training step of ``model`` with Nimble (see the module docstring) and return its trainer.

    ``loss``: "mse" (labels shaped like the output; the mean over every element, as PyTorch's
    MSELoss) or "cross_entropy" (int64 class indices, one per batch row; the sum over the batch);
    ``optimizer``: "sgd", "momentum" (0.9), "adam" or "adamw", as PyTorch's, with learning rate ``lr``
    (positive) and ``weight_decay`` (>= 0; None: PyTorch's default, 0.01 for adamw, else 0). ``kernels``: as
    ``build``'s: "auto" (default) is "best" on a CUDA machine with the vendor wheels, TVM's kernels on a CPU
    target; "vendor" puts the forward convolutions and the convolution gradients (conv2d_transpose for
    dL/dx, the CNHW convolution for dL/dW) on cuDNN, "best" chooses per operator by measurement, "tvm" keeps
    TVM's. ``precision``: "fp32", "tf32" (TF32 tensor
    cores in the vendor kernels) or "bf16" (bfloat16 forward and backward, float32 master weights). A model
    with operators TVM's gradient cannot differentiate is refused with a ModelError naming them."""
    step = training_step(model, loss, optimizer, lr, shape_dict, weight_decay, precision)
    return NimbleTrainer(build_step(step, target, kernels=kernels, max_streams=max_streams), step, device)


def build_step(step: TrainingStep, target="llvm", *, kernels: str = "auto", max_streams="auto", **options):
    """The step's module (``build``'s result) with ``kernels``: for vendor kernels the providers of inference
    and ``cudnn_grad``, the convolution gradients' provider (used only when named: see its module). The step is
    already in its precision, so the build keeps fp32 (the optimizer's update must not be converted too); tf32
    becomes the build's allow_tf32. ``options``: the rest of ``build``'s."""
    from tvm_nimble.relay_passes import providers

    from .build import build

    if kernels != "tvm" and "providers" not in options:
        options["providers"] = tuple(p.name for p in providers.offloading("cuda")) + ("cudnn_grad",)
    return build(step.mod, target, max_streams=max_streams, kernels=kernels, allow_tf32=step.precision == "tf32",
                 **options)
