"""What a benchmark ran on, recorded with every run (``machines.json`` beside results.csv), so that two
runs can be compared honestly: GPU, driver, CUDA runtime, clocks, and the versions of every framework."""
from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import subprocess


def _version(module: str) -> str | None:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # noqa: BLE001  (not installed, or broken: not part of this run)
        return None


def _gpu() -> dict:
    info: dict = {}
    try:
        from cuda.bindings import runtime as rt

        _, prop = rt.cudaGetDeviceProperties(0)
        name = prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name)
        info["gpu"] = name.split("\x00")[0].strip()
        info["sm"] = f"sm_{prop.major}{prop.minor}"
        info["driver"] = rt.cudaDriverGetVersion()[1]
        info["cuda_runtime"] = rt.cudaRuntimeGetVersion()[1]
    except Exception:  # noqa: BLE001
        pass
    try:  # clocks and the driver's own version string, where nvidia-smi is present
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem,clocks.max.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        fields = [f.strip() for f in out.splitlines()[0].split(",")]
        info.update(driver_version=fields[0], sm_clock_mhz=fields[1], mem_clock_mhz=fields[2],
                    max_sm_clock_mhz=fields[3])
    except Exception:  # noqa: BLE001
        pass
    return info


def describe(device: str, use_gpu: bool) -> dict:
    entry = {"date": datetime.date.today().isoformat(), "device": device, "cpu": platform.processor() or platform.machine(),
             "cores": os.cpu_count(), "python": platform.python_version()}
    if use_gpu:
        entry.update(_gpu())
    for module in ("tvm", "tvm_ffi", "numpy", "onnx", "torch", "onnxruntime", "tensorrt"):
        v = _version(module)
        if v:
            entry[module] = v
    return entry


def record(out_dir: str, entry: dict) -> str:
    """Append ``entry`` to ``out_dir/machines.json`` (unless the same entry is already there)."""
    path = os.path.join(out_dir, "machines.json")
    entries = json.load(open(path)) if os.path.exists(path) else []
    if entry not in entries:
        entries.append(entry)
        with open(path, "w") as f:
            json.dump(entries, f, indent=1, sort_keys=True)
    return path
