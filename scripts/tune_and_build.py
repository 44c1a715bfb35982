"""Tuning-plus-build entry point: see tvm_nimble/cli/tune.py (same as `tvm-nimble tune`).

    python scripts/tune_and_build.py model.onnx --target cuda --arch sm_90 --trials 300 --time-budget 480 -o out.nimble
"""

from tvm_nimble.cli.tune import main

if __name__ == "__main__":
    main()
