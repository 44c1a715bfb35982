"""`make run`: build the built-in Inception-style net with Nimble, check it, time it vs stock TVM."""
from __future__ import annotations

import numpy as np


def gpu_available() -> bool:
    try:
        from .runtime import ensure_cuda_runtime
        import tvm

        ensure_cuda_runtime()
        return bool(tvm.cuda(0).exist)
    except Exception:
        return False


def run_demo(model_path: str | None = None, target: str | None = None, arch: str | None = None,
             iters: int = 50, blocks: int | None = None) -> list[dict]:
    import tvm

    from . import zoo
    from .builder import build, normalize_target
    from .executor import NimbleExecutor
    from .frontend import from_onnx, load_onnx_model
    from .stock import StockVM, build_stock_vm
    from .timing import measure

    use_gpu = target == "cuda" or (target is None and gpu_available())
    if use_gpu:
        dev = tvm.cuda(0)
        arch = arch or f"sm_{dev.compute_version.replace('.', '')}"
        tgt = normalize_target({"kind": "cuda", "arch": arch})
    else:
        dev = tvm.cpu(0)
        tgt = normalize_target({"kind": "llvm"})
    if model_path:
        model = load_onnx_model(model_path)
        name = model_path
    else:
        model = zoo.inception(blocks=blocks or (6 if use_gpu else 3))
        name = f"zoo inception ({blocks or (6 if use_gpu else 3)} blocks)"
    inputs = zoo.random_inputs(model, seed=0)
    mod = from_onnx(model)
    print(f"model: {name}   target: {tgt.kind.name}{' ' + arch if use_gpu else ''}")

    nimble = build(mod, tgt)
    plan = nimble.plan
    print(f"Nimble schedule: {len(plan.launches)} kernels on {plan.num_streams} stream(s), "
          f"{sum(len(l.waits) for l in plan.launches)} cross-stream waits")
    stock = StockVM(build_stock_vm(mod, tgt), dev, list(inputs.values()))
    ref = stock.outputs()
    rows = []

    def check(outs, what):
        for o, r in zip(outs, ref):
            np.testing.assert_allclose(o, r, rtol=1e-3, atol=1e-3, err_msg=f"{what} differs from stock TVM")

    modes = ["cuda-graph", "single-stream", "streams"] if use_gpu else ["sequential"]
    systems = [("stock TVM VM", stock, stock.sync)]
    if use_gpu:
        graph_vm = StockVM(build_stock_vm(mod, tgt, cuda_graph=True), dev, list(inputs.values()))
        check(graph_vm.outputs(), "stock TVM VM + CUDA graph")
        systems.append(("stock TVM VM + CUDA graph", graph_vm, graph_vm.sync))
    executors = []
    for mode in modes:
        ex = NimbleExecutor(nimble, dev, mode=mode)
        executors.append(ex)
        outs = [o.numpy() for o in ex(*inputs.values())]
        check(outs, f"Nimble ({mode})")
        for k, v in inputs.items():
            ex.set_input(k, v)
        label = {"cuda-graph": "Nimble multi-stream CUDA graph", "single-stream": "Nimble single-stream CUDA graph",
                 "streams": "Nimble multi-stream, no graph", "sequential": "Nimble AoT replay (CPU)"}[mode]
        systems.append((label, ex.run, ex.sync))
    print("outputs match stock TVM on every system (rtol=atol=1e-3)")
    for label, fn, sync in systems:
        r = measure(fn, sync, warmup=10, iters=iters)
        rows.append({"system": label, **r})
    base = rows[1 if use_gpu else 0]["median_ms"]
    base_label = rows[1 if use_gpu else 0]["system"]
    width = max(len(r["system"]) for r in rows)
    print(f"\n{'system'.ljust(width)}  median ms  p90 ms  speedup vs {base_label}")
    for r in rows:
        print(f"{r['system'].ljust(width)}  {r['median_ms']:9.3f}  {r['p90_ms']:6.3f}  {base / r['median_ms']:.2f}x")
    for ex in executors:
        ex.close()
    return rows
