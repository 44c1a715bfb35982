"""Benchmark harness entry point: see tvm_nimble/bench_cli.py (same as `tvm-nimble bench`).

    python scripts/benchmark.py --models incept6,nasnet --batch 1
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_nimble.bench_cli import main  # noqa: E402

if __name__ == "__main__":
    main()
