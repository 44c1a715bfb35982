"""Benchmark harness: Nimble vs stock TVM (and PyTorch / TensorRT where present), side by side.

Every system is built from the same model. The TVM/Nimble systems are checked against each other,
and every system against an independent reference (PyTorch fp32, or the ONNX reference evaluator)
that must depend on its input; then all systems are timed in one process, interleaved round by
round, after warm-up. Rows go to ``results.csv`` (columns in ``bench.report``); ``RESULTS.md`` and a
bar chart are regenerated from the whole CSV, and ``machines.json`` records what the run ran on.
A system that cannot run here (no GPU, no torch, no TensorRT) is reported as such, never
with a made-up number.
"""
from __future__ import annotations

import datetime
import os
import platform
import time

import numpy as np

from tvm_nimble.bench.report import NIMBLE_SYSTEMS, append_rows, write_report
from tvm_nimble.bench.system import System  # noqa: F401  (scripts import it from here)
from tvm_nimble.compiler.accuracy import rel_l2  # the build's accuracy report measures the same way

GPU_MODES = ("single-stream", "cuda-graph", "streams")  # executor modes timed on a GPU
#: every system a run can time; ``skip`` (``bench --skip``) names any of them
SYSTEM_NAMES = ("tvm-vm", "tvm-vm-cudagraph", *NIMBLE_SYSTEMS.values(), "nimble-auto", "torch-eager",
                "torch-cudagraph", "torch-compile", "ort-cuda", "ort-cuda-graph", "tensorrt")


def tvm_system_names(use_gpu: bool) -> tuple:
    """The stock TVM and Nimble systems :func:`tvm_systems` builds on a GPU, or on a CPU."""
    if use_gpu:
        return ("tvm-vm", "tvm-vm-cudagraph", *(NIMBLE_SYSTEMS[mode] for mode in GPU_MODES), "nimble-auto")
    return ("tvm-vm", NIMBLE_SYSTEMS["sequential"])


def check_skip(names) -> frozenset:
    """The systems to skip, checked: known names, and at least one Nimble system left to time."""
    skip = frozenset(n for n in names if n)
    unknown = sorted(skip - set(SYSTEM_NAMES))
    if unknown:
        raise ValueError(f"--skip {','.join(unknown)}: no such system; the systems are {', '.join(SYSTEM_NAMES)}")
    if all(n in skip for n in SYSTEM_NAMES if n.startswith("nimble")):
        raise ValueError("--skip names every Nimble system: keep at least one (nimble-auto is the build's default)")
    return skip


def device_name(use_gpu: bool) -> str:
    if use_gpu:
        try:
            from cuda.bindings import runtime as rt

            _, prop = rt.cudaGetDeviceProperties(0)
            name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
            return name.split("\x00")[0].strip()
        except Exception:
            return "cuda GPU"
    return f"CPU {platform.processor() or platform.machine()} x{os.cpu_count()}"


def tvm_systems(model, options, device, inputs: list[np.ndarray], use_gpu: bool, nimble=None,
                skip: frozenset = frozenset()) -> list[System]:
    """Stock TVM and Nimble systems, all from the same kernels (tuning database, providers' calls).

    ``model`` is an ONNX model or a Relax IRModule (computed in ``options.precision``), or a
    ``kernel_choice.Selection`` (precision and kernels chosen already); ``options`` the
    :class:`~tvm_nimble.compiler.options.BuildOptions` of every TVM/Nimble system; ``nimble`` a NimbleModule already built from ``model`` with them (built here if None).
    Each system's ``build_s`` counts the import and the kernel choice they share (when done here), its own
    build, and loading it to run (an executor, a CUDA graph's capture); None where a part was given already.
    A system named in ``skip`` is neither built nor returned.
    """
    from tvm_nimble.compiler.build import choose_kernels, with_nchw_fallback
    from tvm_nimble.compiler.kernel_choice import Selection
    from tvm_nimble.compiler.session import BuildSession
    from tvm_nimble.compiler.stages import import_model
    from tvm_nimble.compiler.stock import StockVM, build_stock_vm
    from tvm_nimble.compiler.stream_choice import choose_streams
    from tvm_nimble.compiler.tuning.database import open_tuning_database
    from tvm_nimble.runtime.loading import NimbleExecutor

    start = time.perf_counter()
    session = BuildSession(options)  # one timer and cache for the kernel choice, the builds and the stream choice
    if isinstance(model, Selection):
        selection = model
    else:  # the same merged (or separate) module for stock TVM and Nimble: the same kernels
        fp32_mod = import_model(model)
        (selection, merge_choice), session = with_nchw_fallback(lambda s: choose_kernels(fp32_mod, s), session)
        options = session.options
        if merge_choice is not None:
            print(f"[bench] {merge_choice.lines()[0]}", flush=True)
    shared_s = None if isinstance(model, Selection) else time.perf_counter() - start

    def since(t0, before):  # seconds of a build made of a shared part and its own since t0
        return None if before is None else before + time.perf_counter() - t0
    choice = selection.choice
    if choice.timings:
        print(f"[bench] {choice.summary()}", flush=True)
    if choice.gemm_algorithms:
        print("\n".join(f"[bench] {line}" for line in choice.gemm_lines()), flush=True)
    target = options.target
    db = open_tuning_database(options.tuning_db) if options.tuning_db else None
    systems = []
    # where the build time went, printed as one line: the part the systems share and each one's own
    parts = {"import and kernel choice": shared_s} if shared_s is not None else {}
    if "tvm-vm" not in skip:
        t0 = time.perf_counter()
        vm = StockVM(build_stock_vm(selection.mod, target, tuning_database=db), device, inputs)
        systems.append(System("tvm-vm", vm, vm.sync, vm.outputs, since(t0, shared_s)))
        parts["stock TVM VM"] = time.perf_counter() - t0
    if use_gpu and "tvm-vm-cudagraph" not in skip:
        t0 = time.perf_counter()
        g = StockVM(build_stock_vm(selection.mod, target, cuda_graph=True, tuning_database=db), device, inputs)
        systems.append(System("tvm-vm-cudagraph", g, g.sync, g.outputs, since(t0, shared_s)))
        parts["stock TVM VM + CUDA graph"] = time.perf_counter() - t0
    # Nimble's widest schedule, the one the paper's algorithm gives
    t0 = time.perf_counter()
    nimble_s = None if nimble is not None else shared_s
    if nimble is None:
        nimble = session.with_options(options.replace(max_streams=None)).build(selection)
        parts["Nimble's build"] = time.perf_counter() - t0
    nimble_s = since(t0, nimble_s)
    variants = [(NIMBLE_SYSTEMS[mode], nimble, mode, nimble_s) for mode in (GPU_MODES if use_gpu else ("sequential",))]
    if use_gpu and getattr(nimble, "lowered", None) is not None and "nimble-auto" not in skip:
        t0 = time.perf_counter()
        auto, record = choose_streams(nimble, session)  # the same kernels, the stream cap measured here
        print(f"[bench] {record.summary()}", flush=True)
        variants.append(("nimble-auto", auto, "cuda-graph", since(t0, nimble_s)))
        parts["stream choice"] = time.perf_counter() - t0
    if parts:
        print("[bench] build seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()), flush=True)
    for name, module, mode, built_s in [v for v in variants if v[0] not in skip]:
        t0 = time.perf_counter()
        # check_inputs stays on: the index check runs in set_input, once here, and the timed ex.run never checks
        ex = NimbleExecutor(module, device, mode=mode)
        for i, x in enumerate(inputs):
            ex.set_input(i, x)

        def outs(ex=ex):
            ex.run()
            return [ex.get_output(i).numpy() for i in range(ex.get_num_outputs())]

        systems.append(System(name, ex.run, ex.sync, outs, since(t0, built_s)))
    return systems


def torch_tf32_off():
    """fp32 means fp32 on every side: the TVM/Nimble kernels do not use TF32 either."""
    set_torch_tf32(False)


def set_torch_tf32(on: bool) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def torch_reference(torch_model, input_sets: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """PyTorch's fp32 outputs (TF32 off) for each set of inputs: the reference every system is checked against."""
    import torch

    was = torch.backends.cuda.matmul.allow_tf32
    torch_tf32_off()
    model = torch_model.float().eval().cuda()
    outs = []
    with torch.no_grad():
        for inputs in input_sets:
            y = model(*[torch.from_numpy(x).cuda() for x in inputs])
            outs.append([t.float().cpu().numpy() for t in (y if isinstance(y, (list, tuple)) else [y])])
    set_torch_tf32(was)  # a tf32 run's peers keep their setting
    return outs


#: the results.csv ``dtype`` of each precision (fp32 and fp16 as rows before the precision names had them)
ROW_DTYPE = {"fp32": "float32", "tf32": "tf32", "fp16": "float16", "bf16": "bfloat16"}


#: torch.compile(mode="reduce-overhead") compiles on the first call and records its CUDA graph in the next
#: ones (its cudagraph trees warm up first): after these calls it is ready, and they count as its build
TORCH_COMPILE_READY_CALLS = 3


def torch_systems(torch_model, inputs: list[np.ndarray], precision: str = "fp32",
                  skip: frozenset = frozenset()) -> tuple[list[System], list[str]]:
    """PyTorch eager, CUDA graph and torch.compile(reduce-overhead) in ``precision`` (``.half()`` /
    ``.bfloat16()`` of the model and its float inputs, TF32 flags for tf32), when torch and a GPU exist;
    torch.compile (a minute on a large net) only when ``skip`` does not name it."""
    try:
        import torch
    except ImportError:
        return [], ["PyTorch not installed: torch rows skipped"]
    if torch_model is None:
        return [], ["no PyTorch definition of this model (zoo models are ONNX): torch rows skipped"]
    if not torch.cuda.is_available():
        return [], ["PyTorch has no CUDA device here: torch rows skipped"]
    start = time.perf_counter()
    model = torch_model.eval().cuda()
    xs = [torch.from_numpy(x).cuda() for x in inputs]
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if half is not None:  # integer inputs (ids, masks) stay integers
        model, xs = model.to(half), [x.to(half) if x.is_floating_point() else x for x in xs]
    tf32 = precision == "tf32"
    set_torch_tf32(tf32)  # what CUDA-graph capture and torch.compile record
    sync = torch.cuda.synchronize
    systems = []

    def eager():
        set_torch_tf32(tf32)  # eager reads the flags on every call; the fp32 reference turns them off
        with torch.no_grad():
            return model(*xs)

    eager()
    sync()
    systems.append(System("torch-eager", eager, sync, lambda: [eager().float().cpu().numpy()],
                          time.perf_counter() - start))  # to the GPU, and one call
    t0 = time.perf_counter()
    static_out = [None]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(*xs)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out[0] = model(*xs)
    def replayed():  # capture does not execute: replay before reading the static output
        graph.replay()
        sync()
        return [static_out[0].float().cpu().numpy()]

    sync()
    systems.append(System("torch-cudagraph", graph.replay, sync, replayed, time.perf_counter() - t0))  # warm-up, capture
    if "torch-compile" in skip:
        return systems, []
    t0 = time.perf_counter()
    compiled = torch.compile(model, mode="reduce-overhead")

    def comp():
        with torch.no_grad():
            return compiled(*xs)

    for _ in range(TORCH_COMPILE_READY_CALLS):  # compile, then record its CUDA graphs
        comp()
    sync()
    systems.append(System("torch-compile", comp, sync, lambda: [comp().clone().float().cpu().numpy()],
                          time.perf_counter() - t0))
    return systems, []


def tensorrt_systems(onnx_model, feeds: dict[str, np.ndarray], precision: str = "fp32",
                     use_gpu: bool = True) -> tuple[list[System], list[str]]:
    """TensorRT through its ONNX parser, when it is importable and a GPU is present; else a note why not."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return [], ["TensorRT not installed: no TensorRT row (it cannot be installed on our machines)"]
    if not use_gpu:
        return [], ["TensorRT needs a GPU: no TensorRT row on this run"]
    from tvm_nimble.bench.tensorrt import TensorRTEngine, TensorRTUnavailable

    if precision not in ("fp32", "fp16"):
        return [], [f"the TensorRT row is fp32 or fp16 here: none for {precision}"]
    t0 = time.perf_counter()
    try:
        engine = TensorRTEngine(onnx_model, feeds, ROW_DTYPE[precision])
    except TensorRTUnavailable as e:
        return [], [f"{e}: no TensorRT row"]
    return [System("tensorrt", engine.run, engine.sync, engine.outputs, time.perf_counter() - t0)], []


def interleaved_timing(systems: list[System], rounds: int = 5, iters: int = 50, warmup: int = 10) -> dict:
    """Time each system ``iters`` times per round, rounds interleaved: name -> (median ms, p90 ms)."""
    samples = {s.name: [] for s in systems}
    for s in systems:
        for _ in range(warmup):
            s.run()
        s.sync()
    for _ in range(rounds):
        for s in systems:
            for _ in range(iters):
                t0 = time.perf_counter()
                s.run()
                s.sync()
                samples[s.name].append((time.perf_counter() - t0) * 1e3)
    return {k: (float(np.median(v)), float(np.percentile(v, 90))) for k, v in samples.items()}


class VacuousCheckError(AssertionError):
    """The reference's output does not depend on its input: comparing against it would prove nothing."""


def check_input_dependence(reference_outputs: list, other_outputs: list, tol: float, name: str) -> float:
    """The reference's outputs for two different inputs must differ by far more than ``tol`` (relative L2)."""
    diff = rel_l2(other_outputs, reference_outputs)
    if not diff > 2 * tol:  # an output that ignores the input then misses the reference of one of the two
        raise VacuousCheckError(f"{name}: the reference output barely depends on the input (two inputs differ by "
                                f"{diff:.2g} relative L2, tolerance {tol:g}); an output check would be vacuous, "
                                "so the model is not timed")
    return diff


#: models up to this size (bytes of ONNX) are checked against the ONNX reference evaluator when
#: no PyTorch definition is at hand; larger ones are too slow for it
ONNX_REFERENCE_MAX_BYTES = 8 << 20


#: a peer (PyTorch, ONNX Runtime) this many times further from the reference than our systems may be has a
#: wrong output (a broken CUDA-graph capture, NaN): it is not timed, and its error widens no tolerance
WRONG_PEER_FACTOR = 10


def reference_errors(name: str, model, systems: list[System], inputs: list[np.ndarray], precision: str,
                     torch_model=None) -> tuple[dict[str, float], dict[str, str]]:
    """(relative L2 error of every system against an independent reference, {peer: why its output is wrong}),
    after checking that the reference depends on its input: PyTorch fp32 (TF32 off) when ``torch_model`` is
    given, else the ONNX reference evaluator for small models; ({}, {}) (no check) otherwise. Raises when one of
    our systems (TVM, Nimble) or a peer within :data:`WRONG_PEER_FACTOR` of the tolerance mismatches."""
    from tvm_nimble import zoo
    from tvm_nimble.compiler.frontend.onnx_import import fits_in_memory_checks

    second = list(zoo.random_inputs(model, seed=1).values())
    if torch_model is not None:
        label = "PyTorch fp32"
        ref, other = torch_reference(torch_model, [inputs, second])
    elif fits_in_memory_checks(model, limit=ONNX_REFERENCE_MAX_BYTES + 1):
        from onnx.reference import ReferenceEvaluator

        label = "the ONNX reference evaluator"
        evaluator = ReferenceEvaluator(model)
        names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        ref, other = ([np.asarray(o) for o in evaluator.run(None, dict(zip(names, xs)))] for xs in (inputs, second))
    else:
        return {}, {}
    tol = 5e-3 if precision == "fp32" else 5e-2
    check_input_dependence(ref, other, tol, name)
    errors = {}
    for s in systems:
        errors[s.name] = rel_l2(s.outputs(), ref)
        print(f"[bench] {name}: {s.name} rel L2 vs {label} {errors[s.name]:.2e}", flush=True)
    wrong = {k: f"{k}'s output is wrong (relative L2 {v:.2e} against {label}, over {WRONG_PEER_FACTOR * tol:g})"
             for k, v in errors.items() if not k.startswith(("tvm", "nimble")) and not v <= WRONG_PEER_FACTOR * tol}
    # PyTorch in that precision, where its output is sane
    own = [errors[n] for n in ("torch-eager", "torch-cudagraph") if n in errors and n not in wrong]
    if precision != "fp32" and own:  # as close as PyTorch's own run in that precision
        tol = max(tol, 2 * own[0])
    bad = {k: v for k, v in errors.items() if not v <= tol and not k.startswith("torch") and k not in wrong}
    if bad:
        raise AssertionError(f"{name}: outputs disagree with {label} (relative L2 > {tol:g}): {bad}")
    return errors, wrong


def check_agreement(systems: list[System], reference_name: str, rtol=1e-3, atol=1e-3) -> dict:
    ref = next(s for s in systems if s.name == reference_name).outputs()
    errors = {}
    for s in systems:
        out = s.outputs()
        err = max(float(np.abs(np.asarray(o) - r).max()) for o, r in zip(out, ref))
        errors[s.name] = err
        scale = max(1.0, max(float(np.abs(r).max()) for r in ref))
        if err > atol * scale + rtol * scale:
            raise AssertionError(f"{s.name} disagrees with {reference_name}: max abs error {err:.3g}")
    return errors


def peer_or_why(title: str, make, *args) -> tuple[list, list[str]]:
    """``make(*args)``'s (systems, notes), or no systems and one note where making the peer raised: a peer that cannot
    run leaves its rows out, saying why, and the benchmark goes on."""
    try:
        return make(*args)
    except Exception as err:  # noqa: BLE001 -- any failure of a peer's setup is a note, never the run's end
        return [], [f"{title}: {type(err).__name__}: {' '.join(str(err).split())[:200]}: no rows"]


def run_benchmark(models: dict, target=None, batches=(1,), rounds: int = 5, iters: int = 50,
                  out_dir: str = "bench-results", tuning_db: str | None = None, torch_models: dict | None = None,
                  precision: str = "fp32", baseline_cache: dict | None = None, kernels: str = "tvm-default",
                  db_trials: str = "", build_extra: dict | None = None,
                  skip: frozenset = frozenset()) -> tuple[list[dict], list[str]]:
    """Benchmark ``models`` ({name: builder(batch=) -> onnx model}); returns (rows, notes).

    ``skip``: systems neither built nor timed (:data:`SYSTEM_NAMES`, checked by :func:`check_skip`).

    ``build_extra``: more build options for every TVM/Nimble system (``timing_cache``).

    ``kernels`` and ``db_trials`` label the rows (see ``bench.report``): which kernels the TVM/Nimble
    systems ran, and the trial count of the tuning database a tuned/untuned pair of runs shares.

    ``baseline_cache`` (a dict the caller keeps) lets a second run reuse the PyTorch and TensorRT systems
    built by the first: they do not depend on the tuning database, and torch.compile costs up to a minute
    per model. They are timed again, interleaved with the new run's systems."""
    import tvm

    from tvm_nimble import zoo
    from tvm_nimble.bench.onnxruntime_peer import onnxruntime_systems
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.target import default_kind, resolve_target
    from tvm_nimble.relay_passes import providers as provider_registry
    from tvm_nimble.relay_passes.precision import precision_name

    precision = precision_name(precision)
    dtype = ROW_DTYPE[precision]

    t = resolve_target(target if target is not None else default_kind())
    use_gpu = t.kind.name == "cuda"
    dev = tvm.cuda(0) if use_gpu else tvm.cpu(0)
    ours = tvm_system_names(use_gpu)
    if set(ours) <= skip:  # before any build
        raise ValueError(f"--skip {','.join(sorted(skip))} leaves no TVM or Nimble system to time on {t.kind.name}: "
                         f"keep one of {', '.join(ours)}")
    device = device_name(use_gpu)
    today = datetime.date.today().isoformat()
    rows, notes = [], []
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, "results.csv")
    failed: list[str] = []  # models not timed
    peers_left_out: list[str] = []
    for name, builder in models.items():
        for batch in batches:
            print(f"[bench] {name} batch {batch} {dtype}: building", flush=True)
            model = builder(batch=batch)
            feeds = zoo.random_inputs(model, seed=0)
            inputs = list(feeds.values())
            options = BuildOptions.create(t, kernels=kernels if kernels in ("vendor", "best") else "tvm",
                                          tuning_db=tuning_db, precision=precision, **(build_extra or {}))
            systems = tvm_systems(model, options, dev, inputs, use_gpu, skip=skip)
            key = (builder, batch, precision)
            tm = (torch_models or {}).get(name)
            if baseline_cache is not None and key in baseline_cache:
                extra, why = baseline_cache[key]
            else:
                extra, why = torch_systems(tm(batch) if callable(tm) else tm, inputs, precision, skip)
                trt, why_trt = (peer_or_why("TensorRT", tensorrt_systems, model, feeds, precision, use_gpu)
                                if "tensorrt" not in skip else ([], []))
                ort_systems, why_ort = (peer_or_why("ONNX Runtime", onnxruntime_systems, model, feeds, precision,
                                                     use_gpu) if not {"ort-cuda", "ort-cuda-graph"} <= skip
                                        else ([], []))
                # PyTorch eager stays for the output check even when not timed: its error is PyTorch's own in
                # this precision, the bound our reduced-precision outputs are held to (the CUDA-graph peer's
                # capture can break, see reference_errors)
                extra = [s for s in extra + trt + ort_systems if s.name not in skip or s.name == "torch-eager"]
                why += why_trt + why_ort
                if baseline_cache is not None:
                    baseline_cache[key] = extra, why
            systems += extra
            for w in why:
                if w not in notes:
                    notes.append(w)
            # reduced-precision rows agree to that precision (different kernels round differently)
            tol = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 2e-2, "bf16": 1e-1}[precision]
            # the TVM/Nimble systems run the same kernels: they agree tightly with each other; other
            # frameworks are checked against the PyTorch fp32 reference below, by relative L2
            ours = [s for s in systems if s.name.startswith(("tvm", "nimble"))]
            check_agreement(ours, ours[0].name, rtol=tol, atol=tol)
            try:
                errors, wrong = reference_errors(name, model, systems, inputs, precision,
                                                 tm(batch) if callable(tm) and use_gpu else None)
            except AssertionError as err:  # a vacuous check or a wrong output: this model is not timed
                failed.append(f"{name} batch {batch} {dtype}: {str(err).splitlines()[0]}")
                print(f"[bench] NOT TIMED: {failed[-1]}", flush=True)
                continue
            for why in wrong.values():  # a peer with a wrong output is left out; the model and the others are timed
                peers_left_out.append(f"{name} batch {batch} {dtype}: {why}")
                print(f"[bench] NOT TIMED: {peers_left_out[-1]}", flush=True)
            systems = [s for s in systems if s.name not in wrong and s.name not in skip]
            timing = interleaved_timing(systems, rounds=rounds, iters=iters)
            # providers named on top of the defaults (e.g. attention_split) are part of what a row measured
            label = kernels + "".join(f"+{p}" for p in options.providers or ()
                                      if kernels in ("vendor", "best") and not provider_registry.get(p).by_default)
            label += f"+{options.layout}" if options.layout != "auto" else ""  # a layout asked for, not the default
            built = {s.name: s.build_s for s in systems if s.build_s is not None}
            new = [{"date": today, "device": device, "model": name, "batch": batch, "dtype": dtype, "kernels": label,
                    "db_trials": db_trials, "system": system, "median_ms": f"{med:.4f}", "p90_ms": f"{p90:.4f}",
                    "rel_err": f"{errors[system]:.2e}" if system in errors else "",
                    "build_s": f"{built[system]:.3f}" if system in built else ""}
                   for system, (med, p90) in timing.items()]
            print(f"[bench] {name} batch {batch}: " + ", ".join(f"{r['system']} {r['median_ms']}" for r in new), flush=True)
            append_rows(csv_path, new)  # model by model: a run cut short keeps what it measured
            rows += new
    if not use_gpu:
        notes.append("CPU run: CUDA-graph and multi-stream systems need a GPU; on CPU Nimble replays the plan "
                     "sequentially (ahead-of-time, no VM interpretation).")
    from tvm_nimble.bench.machine import describe, record

    machine = describe(device, use_gpu)
    record(out_dir, machine)
    versions = "Latest run on: " + ", ".join(f"{k} {v}" for k, v in machine.items() if k not in ("date", "device"))
    write_report(csv_path, os.path.join(out_dir, "RESULTS.md"), os.path.join(out_dir, "results.png"),
                 notes + [f"not timed: {f}" for f in failed + peers_left_out], versions)
    if failed:
        from tvm_nimble.errors import NimbleError

        raise NimbleError(f"{len(failed)} model(s) not timed, the others were: {'; '.join(failed)}")
    return rows, notes
