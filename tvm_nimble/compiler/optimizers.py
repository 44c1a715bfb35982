"""The optimizers a training step updates its parameters with, by name (``build_training(optimizer=...)``).

``sgd`` and ``momentum`` (0.9) are TVM's (``relax.training.optimizer``). ``adam`` and ``adamw`` are
written here: TVM 0.27's ``Adam`` fails in its own ``init`` (it hands numpy a TVM dtype object), and TVM
has no AdamW. Each is a TVM :class:`~tvm.relax.training.optimizer.Optimizer`, so ``SetupTrainer``
takes it like TVM's own, and its update is a Relax function that the training step inlines: every
parameter's update is independent of the others', so stream assignment spreads them over streams.

The updates are PyTorch's (``torch.optim``), with the same defaults:
- ``adam``: ``weight_decay`` is an L2 term added to the gradient (``torch.optim.Adam``);
- ``adamw``: decoupled weight decay, ``p *= 1 - lr * weight_decay`` before the Adam step
  (``torch.optim.AdamW``, default ``weight_decay=0.01``);
- ``sgd`` / ``momentum``: ``weight_decay`` is added to the gradient (``torch.optim.SGD``).
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.op import add, divide, multiply, sqrt, subtract
from tvm.relax.training.optimizer import SGD, MomentumSGD, Optimizer

from tvm_nimble.errors import NimbleError

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
#: the weight decay an optimizer gets when none is given (PyTorch's defaults)
DEFAULT_WEIGHT_DECAY = {"sgd": 0.0, "momentum": 0.0, "adam": 0.0, "adamw": 0.01}


class Adam(Optimizer):
    """Adam (``decoupled=False``, as ``torch.optim.Adam``) or AdamW (``decoupled=True``, as
    ``torch.optim.AdamW``). The state is ``(steps, beta1 ** steps, beta2 ** steps, m..., v...)``, TVM's
    layout for its Adam, so TVM's ``Trainer`` runs it too."""

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, decoupled: bool = False):
        super().__init__("AdamW" if decoupled else "Adam")
        self.lr, self.eps, self.weight_decay, self.decoupled = float(lr), float(eps), float(weight_decay), decoupled
        self.beta1, self.beta2 = (float(b) for b in betas)

    def init(self, params) -> "Adam":
        params = params if isinstance(params, list) else [params]
        self._set_params_and_dtype(params)
        dtype = str(self.dtype)  # (TVM's Adam passes its dtype object to numpy here, and fails)
        zeros = [tvm.runtime.tensor(np.zeros([int(d) for d in p.ty.shape.values], dtype)) for p in self.param_list]
        self.state = (tvm.runtime.tensor(np.zeros((), "int64")), tvm.runtime.tensor(np.ones((), dtype)),
                      tvm.runtime.tensor(np.ones((), dtype)), *zeros,
                      *(tvm.runtime.tensor(z.numpy()) for z in zeros))
        return self

    def get_function(self) -> relax.Function:
        self._check_init()
        plist, dtype = self.param_list, str(self.dtype)
        n = len(plist)
        param_var = relax.Var("params", relax.TupleType([p.ty for p in plist]))
        grad_var = relax.Var("gradients", relax.TupleType([p.ty for p in plist]))
        scalar = relax.TensorType((), dtype)
        state_var = relax.Var("optim_states", relax.TupleType(
            [relax.TensorType((), "int64"), scalar, scalar, *(p.ty for p in plist), *(p.ty for p in plist)]))

        def c(value):
            return relax.const(value, dtype)

        bb = relax.BlockBuilder()
        with bb.function(self.name, [param_var, grad_var, state_var]):
            with bb.dataflow():
                steps = bb.emit(add(relax.TupleGetItem(state_var, 0), relax.const(1, "int64")), "num_steps_new")
                beta1_prod = bb.emit(multiply(relax.TupleGetItem(state_var, 1), c(self.beta1)), "beta1_prod")
                beta2_prod = bb.emit(multiply(relax.TupleGetItem(state_var, 2), c(self.beta2)), "beta2_prod")
                # the bias corrections, once for all parameters: lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t)
                step_size = bb.emit(divide(c(self.lr), subtract(c(1.0), beta1_prod)), "step_size")
                v_scale = bb.emit(divide(c(1.0), sqrt(subtract(c(1.0), beta2_prod))), "v_scale")
                new_params, ms, vs = [], [], []
                for i, p_info in enumerate(plist):
                    name = p_info.name
                    p = bb.emit(relax.TupleGetItem(param_var, i), name)
                    g = bb.emit(relax.TupleGetItem(grad_var, i), name + "_grad")
                    m = bb.emit(relax.TupleGetItem(state_var, 3 + i), name + "_m")
                    v = bb.emit(relax.TupleGetItem(state_var, 3 + n + i), name + "_v")
                    if self.weight_decay and self.decoupled:
                        p = bb.emit(multiply(p, c(1.0 - self.lr * self.weight_decay)), name + "_decayed")
                    elif self.weight_decay:
                        g = bb.emit(add(g, multiply(c(self.weight_decay), p)), name + "_grad_decayed")
                    m_new = bb.emit(add(multiply(c(self.beta1), m), multiply(c(1.0 - self.beta1), g)), name + "_m_new")
                    v_new = bb.emit(add(multiply(c(self.beta2), v), multiply(c(1.0 - self.beta2), multiply(g, g))),
                                    name + "_v_new")
                    denom = add(multiply(sqrt(v_new), v_scale), c(self.eps))
                    new_params.append(bb.emit(subtract(p, multiply(step_size, divide(m_new, denom))), name + "_new"))
                    ms.append(m_new)
                    vs.append(v_new)
                params_new = bb.emit_output(relax.Tuple(new_params), "params_new")
                states_new = bb.emit_output(relax.Tuple([steps, beta1_prod, beta2_prod, *ms, *vs]), "optim_states_new")
            bb.emit_func_output((params_new, states_new))
        return bb.get()[self.name]


def check_weight_decay(weight_decay) -> float:
    """``weight_decay`` as a float, refused unless finite and >= 0 (a negative decay grows the weights)."""
    try:
        value = float(weight_decay)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise NimbleError(f"the weight decay must be a number >= 0, got {weight_decay!r}: pass e.g. weight_decay=0.01")
    return value


def make_optimizer(name: str, lr: float, weight_decay: float | None = None) -> Optimizer:
    """The optimizer ``name`` (one of :data:`OPTIMIZERS`) with learning rate ``lr`` (checked by the caller) and
    ``weight_decay`` (None: PyTorch's default for that optimizer)."""
    if name not in OPTIMIZERS:
        raise NimbleError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    wd = DEFAULT_WEIGHT_DECAY[name] if weight_decay is None else check_weight_decay(weight_decay)
    if name == "sgd":
        return SGD(lr, weight_decay=wd)
    if name == "momentum":
        return MomentumSGD(lr, momentum=0.9, weight_decay=wd)
    return Adam(lr, weight_decay=wd, decoupled=name == "adamw")
