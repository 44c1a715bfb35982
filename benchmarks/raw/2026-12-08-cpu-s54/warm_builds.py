"""Cold then warm kernels='vendor' CUDA builds of an ONNX file, each in a fresh process (as build_times and a user's
CLI rebuild run them); prints each build's seconds and phases, then the warm median."""
import json, os, statistics, subprocess, sys, time
if sys.argv[1] == "--one":
    import warnings
    warnings.simplefilter("ignore")
    from tvm_nimble.compiler.options import BuildOptions
    from tvm_nimble.compiler.build import build_with
    stamps = []
    t = time.time()
    build_with(sys.argv[2], BuildOptions.create({"kind": "cuda", "arch": "sm_90"}, precision=sys.argv[3], kernels="vendor"),
               on_phase=lambda n: stamps.append((n, time.time())))
    end = time.time()
    print(json.dumps({"s": end - t, "phases": {n: round(((stamps[i + 1][1] if i + 1 < len(stamps) else end) - s), 2)
                                              for i, (n, s) in enumerate(stamps)}}))
    sys.exit(0)
path, prec, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = []
for i in range(n):
    r = subprocess.run([sys.executable, __file__, "--one", path, prec], capture_output=True, text=True)
    row = json.loads(r.stdout.strip().splitlines()[-1])
    print(os.environ.get("PYTHONPATH"), "cold" if i == 0 else "warm", round(row["s"], 2), row["phases"], flush=True)
    times.append(row["s"])
print("warm median", round(statistics.median(times[1:]), 2))
