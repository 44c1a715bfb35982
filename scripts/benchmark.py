"""Benchmark harness entry point: see tvm_nimble/cli/bench.py (same as `tvm-nimble bench`).

    python scripts/benchmark.py --models incept6,nasnet --batch 1
"""

from tvm_nimble.cli.bench import main

if __name__ == "__main__":
    main()
