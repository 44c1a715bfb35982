"""`make run`: build the built-in Inception-style net with Nimble, check it, time it vs stock TVM."""
from __future__ import annotations

DISPLAY_NAMES = {"tvm-vm": "stock TVM VM", "tvm-vm-cudagraph": "stock TVM VM + CUDA graph",
                 "nimble-multi-stream-graph": "Nimble multi-stream CUDA graph",
                 "nimble-auto": "Nimble, stream cap measured (auto)",
                 "nimble-single-stream-graph": "Nimble single-stream CUDA graph",
                 "nimble-multi-stream-nograph": "Nimble multi-stream, no graph",
                 "nimble-aot-cpu": "Nimble AoT replay (CPU)"}


def run_demo(model_path: str | None = None, target: str | None = None, arch: str | None = None,
             iters: int = 50, blocks: int | None = None) -> list[dict]:
    import tvm

    from tvm_nimble import zoo
    from tvm_nimble.bench.harness import check_agreement, interleaved_timing, tvm_systems
    from tvm_nimble.compiler.session import BuildSession
    from tvm_nimble.compiler.frontend import from_onnx, load_onnx_model
    from tvm_nimble.compiler.kernel_choice import select_kernels
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.target import default_kind, resolve_target

    tgt = resolve_target(target or default_kind(), arch)
    use_gpu = tgt.kind.name == "cuda"
    dev = tvm.cuda(0) if use_gpu else tvm.cpu(0)
    if model_path:
        model = load_onnx_model(model_path)
        name = model_path
    else:
        model = zoo.inception(blocks=blocks or (6 if use_gpu else 3))
        name = f"zoo inception ({blocks or (6 if use_gpu else 3)} blocks)"
    inputs = list(zoo.random_inputs(model, seed=0).values())
    print(f"model: {name}   target: {tgt.kind.name}{' ' + str(tgt.attrs['arch']) if use_gpu else ''}")

    options = BuildOptions(tgt, max_streams=None)  # Nimble's widest schedule
    session = BuildSession(options)
    selection = select_kernels(from_onnx(model), session)  # the same kernels for Nimble and stock TVM
    nimble = session.build(selection)
    plan = nimble.plan
    if selection.kernels == "best":
        print(selection.choice.summary() + " (the same in every system)")
    else:
        print(f"kernels: {'cuDNN / cuBLASLt for convolutions and GEMMs, TVM for the rest' if selection.kernels == 'vendor' else 'TVM'} "
              "(the same in every system)")
    print(f"Nimble schedule: {len(plan.launches)} kernels on {plan.num_streams} stream(s), "
          f"{sum(len(l.waits) for l in plan.launches)} cross-stream waits")
    systems = tvm_systems(selection, options, dev, inputs, use_gpu, nimble=nimble)
    check_agreement(systems, "tvm-vm")
    print("outputs match stock TVM on every system (rtol=atol=1e-3)")
    timing = interleaved_timing(systems, rounds=5, iters=max(1, iters // 5))
    rows = [{"system": DISPLAY_NAMES[name], "median_ms": med, "p90_ms": p90} for name, (med, p90) in timing.items()]
    base = rows[1 if use_gpu else 0]["median_ms"]
    base_label = rows[1 if use_gpu else 0]["system"]
    width = max(len(r["system"]) for r in rows)
    print(f"\n{'system'.ljust(width)}  median ms  p90 ms  speedup vs {base_label}")
    for r in rows:
        print(f"{r['system'].ljust(width)}  {r['median_ms']:9.3f}  {r['p90_ms']:6.3f}  {base / r['median_ms']:.2f}x")
    return rows
