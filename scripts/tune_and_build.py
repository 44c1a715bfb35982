"""Tuning-plus-build entry point: see tvm_nimble/tune_cli.py (same as `tvm-nimble tune`).

    python scripts/tune_and_build.py model.onnx --target cuda --arch sm_90 --trials 300 --time-budget 480 -o out.nimble
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_nimble.tune_cli import main  # noqa: E402

if __name__ == "__main__":
    main()
