"""``tvm_nimble.build``: model in, one :class:`BuildResult` out.

A build is one :class:`~.session.BuildSession` (options, timer, cache, notes, phase times), which runs the
stages of :data:`~.build_stages.STAGES` in order (:mod:`.build_stages`):

    import_model -> apply_precision -> apply_layout        (stages)
    choose_merges                                           merged sibling operators, or not (measured with "auto")
    select_kernels                                          which provider runs each operator (measured with "best")
    build_fixed                                             lower, schedule, generate (or the model check's compile)
    choose_streams                                          with max_streams="auto"
    accuracy.report                                         precisions other than fp32

Every consumer of a build reuses the result instead of re-running a stage: the executor and
``export`` (plan, kernels, params), ``explain`` (assignment, program, lowered module). Where the
kernel choice's model check compiled the selected module already, the build reschedules that build
instead of compiling the same kernels again. The lowered module and kernel library of a build are kept in
the compiled-kernel cache (:mod:`.kernel_cache`, beside the timing cache), so the next build of the same
module loads them instead of lowering and compiling. What each stage chose and measured, and the seconds each phase took, are the result's typed
:class:`~.report.BuildReport` (``result.report``; an artifact keeps it as the JSON dict ``info``).
"""
from __future__ import annotations

from .build_stages import choose_kernels, nchw_fallback, raised_at, with_nchw_fallback  # noqa: F401  (public here)
from .options import BuildOptions
from .report import PHASES, BuildReport  # noqa: F401  (public here)
from .session import BuildSession, CacheMemory, Phases  # noqa: F401  (Phases: public here)
from .stages import BuildResult  # noqa: F401  (public here: ``tvm_nimble.BuildResult``)


def build(model, target="llvm", params: dict | None = None, *, shape_dict: dict | None = None,
          **options) -> BuildResult:
    """Build ``model`` (a Relax IRModule, an ONNX ModelProto, a path to a .onnx file, or a
    :class:`~.kernel_choice.Selection` whose kernels are chosen already) with Nimble.

    ``options`` are the fields of :class:`~.options.BuildOptions`, each checked with a one-line error:

    - ``max_streams`` caps the stream count: 1 gives the single-stream schedule, None Nimble's widest
      schedule, ``"auto"`` (default) the fastest of the caps 1, 2, 3, 4, 6, 8 and the widest, measured
      on the GPU (see :mod:`.stream_choice`; the widest without one). ``memory_budget`` (bytes) bounds the
      concurrency-safe memory pool: auto picks among the schedules that fit, and a fixed cap whose pool
      does not fit is an error.
    - ``kernels``: ``"vendor"`` runs every operator a kernel provider takes (convolutions, GEMMs and
      average pools on cuDNN / cuBLASLt; ``providers`` restricts which) on it, ``"best"`` each on the
      fastest of the providers and TVM measured on the GPU, ``"tvm"`` keeps TVM's kernels; ``"auto"``
      (default, see :func:`~.kernel_choice.resolve_kernels`) is best on a CUDA machine that can build the
      vendor extension (nvcc and the nvidia-cudnn-cu13 / nvidia-cublas wheels), vendor without a GPU
      here, else tvm. ``allow_tf32`` lets cuDNN / cuBLASLt use TF32 tensor cores for fp32 (about 1e-3
      relative error; off by default, like PyTorch's ``allow_tf32=False``).
    - ``precision``: ``"fp32"`` (default), ``"tf32"`` (``allow_tf32``), ``"fp16"`` or ``"bf16"``: convolutions
      and GEMMs compute in the reduced dtype, reductions, softmax and normalizations in float32, the rest
      follows its inputs (:mod:`tvm_nimble.relay_passes.precision`; ``keep_fp32=("matmul",)`` moves
      operators to float32). Inputs and outputs keep the model's dtypes. A build in another precision
      than fp32 measures its relative L2 error against the float32 model on seeded inputs where its
      target runs (``report.accuracy``); ``max_error`` fails the build above it.
    - ``tuning_db`` is a MetaSchedule database directory whose tuned kernels replace the default
      schedules. ``compile_kernels=False`` stops before code generation (what ``explain`` needs).
      ``concat_in_place`` (default on) lets the kernels feeding a concatenation write straight into their
      slice of it where the slices are contiguous, which removes the concatenation's copy kernel.
    - ``rpc_tracker`` (``HOST:PORT``) and ``rpc_key``: what ``best`` and ``auto`` measure runs on a GPU of
      an RPC server registered under that key (``tvm-nimble rpc-server``) instead of this machine's (see
      :mod:`.timers`).
    - ``buckets={"sequence_length": [16, 32, 64]}``: one build per size (several dimensions: every combination)
      of the ONNX model's named dimensions, in one module with the weights once whose executor pads any
      shorter input to its bucket; a model whose padding is not masked is refused (see :mod:`.buckets`).
    - ``batch_sizes=[1, 2, 4, 8]``: one build per batch size (the ONNX model's leading input dimension set
      to it; kernels and streams chosen per bucket) in one module with the weights once, whose executor
      takes any batch (see :mod:`.buckets` and ``tvm_nimble.runtime.buckets``).
    """
    return build_with(model, BuildOptions.create(target, **options), params, shape_dict)


def build_with(model, opts: BuildOptions, params: dict | None = None, shape_dict: dict | None = None,
               timer=None, cache: CacheMemory | None = None, on_phase=None) -> BuildResult:
    """:func:`build` with its options made already (what ``explain``, the CLI and the benchmarks call), as one
    :class:`~.session.BuildSession`. ``timer``: where ``best`` and ``auto`` measure (see :mod:`.timers`; default:
    a GPU behind the options' RPC tracker, else this machine's). ``cache``: what earlier builds of this process
    measured or read, passed on (default: nothing). ``on_phase(name)``: told each phase's name as it begins."""
    return BuildSession(opts, timer, cache, on_phase).build(model, params, shape_dict)
