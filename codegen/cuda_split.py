"""One CUDA module's source compiled by several nvcc processes at once, into the kernels one nvcc makes.

nvcc spends nearly all of a large TVM module's compile in cicc (front end and NVVM, one thread): 16.8 of
18 s for the 6.9 MB source of densenet121's TVM convolution probe. TVM's CUDA source is a preamble
followed by independent ``extern "C" __global__`` kernels, so it splits into translation units (the
preamble and a run of kernels each) whose PTX cicc makes in parallel. Each kernel's PTX is then what one
unit gives, but for its basic-block labels, numbered by the function's place in its unit
(``$L__BB<i>_<j>``): the parts are merged in the source's kernel order with the labels renumbered for
that order, and ptxas and fatbinary make the fatbin from the merged PTX, with TVM's options
(``tests/test_parallel_compile.py`` checks that the machine code equals one nvcc's). The units depend on
the source alone, never on the number of workers, so any number gives the same bytes. A source or PTX
with anything else at its top level (a device function, a global variable) is not split: the caller
compiles it in one piece.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor

from tvm_nimble.relay_passes.tvm_compat import nvcc_ptxas_flags

_KERNEL = 'extern "C" __global__'
#: source bytes per unit: small enough to spread densenet121's probe over 16 cores, large enough that the
#: preamble each unit parses again (about 0.3 s of preprocessing) stays a small part of a unit's time
UNIT_BYTES = 512 * 1024
#: ptxas's threads over the merged PTX (``--split-compile``; a constant: the file must not depend on the machine).
#: One thread took 5.6 s of CPU for densenet121 fp16's 255 kernels (3.5 MB of PTX), the one serial step after the
#: units' parallel nvcc runs
PTXAS_THREADS = 16
_ENTRY = re.compile(r"^\.visible \.entry (\w+)\(")
_LABEL = re.compile(r"\$L__BB\d+_")


def split_units(code: str, unit_bytes: int | None = None) -> list[str] | None:
    """The source as translation units (the preamble, then consecutive kernel definitions of about
    ``unit_bytes`` each, default :data:`UNIT_BYTES`), or None where it is not TVM's preamble-and-kernels
    layout or makes one unit."""
    unit_bytes = unit_bytes or UNIT_BYTES
    lines = code.split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith(_KERNEL)), None)
    if first is None:
        return None
    preamble = "\n".join(lines[:first])
    kernels, current = [], None
    for line in lines[first:]:
        if current is None:
            if line.startswith(_KERNEL) and line.endswith(");"):
                continue  # a forward declaration: no kernel calls another, each unit needs only its own
            if line.startswith(_KERNEL) and line.endswith("{"):
                current = [line]
            elif line.strip():
                return None  # something else at the top level: it may be shared, so do not split
            continue
        current.append(line)
        if line == "}":
            kernels.append("\n".join(current))
            current = None
    if current is not None or len(kernels) < 2:
        return None
    units, size = [[]], 0
    for kernel in kernels:
        if size >= unit_bytes:
            units.append([])
            size = 0
        units[-1].append(kernel)
        size += len(kernel)
    if len(units) < 2:
        return None
    return [preamble + "\n" + "\n\n".join(u) + "\n" for u in units]


def _braces(line: str) -> int:
    """How far ``line`` opens (+) or closes (-) PTX's brace scopes, its comment left out. An entry's inline asm
    opens scopes of its own (``{.reg .f16 low,high;`` ... ``}``, cuda_fp16's conversions, the warp shuffles),
    some closed by a ``}`` at the start of a line, so an entry ends where its depth returns to zero."""
    code = line.split("//", 1)[0]
    return code.count("{") - code.count("}")


def _parse_ptx(ptx: str) -> tuple[list[str], list[str], list[tuple[str, str]]] | None:
    """(header lines, declarations, [(entry name, text)]) of one unit's PTX; None if it has any other top-level
    statement. Declarations: the dynamic shared memory's ``.extern .shared`` array, which every unit that launches
    with dynamic shared memory declares alike (each kernel gets its own at launch: no state shared across units)."""
    lines = ptx.split("\n")
    header, declarations, entries, current, name, depth = [], [], [], None, None, 0
    for line in lines:
        if current is not None:
            current.append(line)
            depth += _braces(line)
            if depth == 0 and line.split("//", 1)[0].strip().endswith("}"):
                entries.append((name, "\n".join(current)))
                current = None
            elif depth < 0:
                return None
            continue
        match = _ENTRY.match(line)
        if match:
            name, current, depth = match.group(1), [line], _braces(line)
        elif line.startswith((".version", ".target", ".address_size")):
            if entries or declarations:
                return None
            header.append(line)
        elif line.startswith(".extern .shared ") and line.endswith("[];"):
            declarations.append(line)
        elif line.strip() and not line.strip().startswith("//"):
            return None  # a global, an extern or a device function: shared state across units
    return (header, declarations, entries) if current is None else None


def merge_ptx(parts: list[str]) -> str | None:
    """The PTX of the units as one module: one header, the units' declarations once each, every entry in unit
    order, labels numbered by the entry's place in the whole (as one cicc run numbers them); None where a part
    does not merge."""
    parsed = [_parse_ptx(p) for p in parts]
    if any(p is None for p in parsed) or len({tuple(h) for h, _, _ in parsed}) != 1:
        return None
    out = list(parsed[0][0])
    out += list(dict.fromkeys(d for _, declarations, _ in parsed for d in declarations))
    index = 0
    for _, _, entries in parsed:
        for name, text in entries:
            out += ["", f"\t// .globl\t{name}", _LABEL.sub(f"$L__BB{index}_", text)]
            index += 1
    return "\n".join(out) + "\n"


def compile_ptx_units(units: list[str], compile_ptx, workers: int) -> list[str]:
    """``compile_ptx(source) -> PTX text`` of every unit, ``workers`` at a time (each is an nvcc process,
    so threads run them side by side), in unit order."""
    if workers <= 1 or len(units) == 1:
        return [compile_ptx(u) for u in units]
    with ThreadPoolExecutor(max_workers=min(workers, len(units))) as pool:
        return list(pool.map(compile_ptx, units))


def ptxas_options() -> list[str]:
    """The ptxas options of TVM's own nvcc compile, for the ptxas step of :func:`fatbin_from_ptx`: with the same
    options, the fatbin made from merged PTX holds the machine code of TVM's one-step compile."""
    return nvcc_ptxas_flags()


def fatbin_from_ptx(ptx: str, nvcc: str, arch: str, ptxas_options: list[str], fmt: str = "fatbin") -> bytes:
    """ptxas and fatbinary over ``ptx`` as nvcc runs them for a ``.cu`` compiled with ``-arch arch``
    (machine code for ``arch`` and the PTX itself); ``fmt="cubin"`` gives the machine code alone. ``ptxas_options``:
    :func:`ptxas_options` for the machine code of TVM's own compile. ptxas assembles the kernels on
    :data:`PTXAS_THREADS` threads (``--split-compile``): every kernel's machine code and resource table are one
    thread's, only the symbol table's order and ptxas's note of its options differ, and a fixed count keeps the
    file the same bytes on any machine."""
    with tempfile.TemporaryDirectory(prefix="nimble-ptx-") as tmp:
        src, out = os.path.join(tmp, "kernels.ptx"), os.path.join(tmp, f"kernels.{fmt}")
        with open(src, "w") as f:
            f.write(ptx)
        for options in ([*ptxas_options, f"--split-compile={PTXAS_THREADS}"], ptxas_options):
            cmd = [nvcc, f"--{fmt}", "-O3", "-arch", arch, f"--ptxas-options={','.join(options)}", "-o", out, src]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode == 0:
                break  # (else once more on one thread: a ptxas older than --split-compile)
        else:
            raise RuntimeError(f"nvcc failed on the merged PTX: {(r.stderr or r.stdout).strip()[-600:]}")
        with open(out, "rb") as f:
            return f.read()
