"""TVMScript functions parsed once per machine (relay_passes/tvm_compat.py, ``_ParseCache``): TVM's tensor
intrinsics imported from the cache are the ones TVM's own parser makes, and the cache is used."""
import json
import os
import subprocess
import sys

import tvm
import tvm_ffi

# In a fresh process: import TVM's tensor intrinsics as a build does, then write every registered intrinsic's
# description and implementation (TVM's JSON) and the parse cache's count of hits to the file argv[1].
_DUMP = r"""
import importlib, json, pkgutil, sys
import tvm
from tvm.s_tir import TensorIntrin
from tvm_nimble.relay_passes import tvm_compat

hits = []
real = tvm_compat._ParseCache.save
tvm_compat._ParseCache.save = lambda self: (hits.append(self.hits), real(self))[1]
tvm_compat.import_tensor_intrinsics()
import tvm.s_tir.tensor_intrin as package

out = {}
for info in pkgutil.iter_modules(package.__path__):
    module = sys.modules.get(f"{package.__name__}.{info.name}")
    for value in vars(module).values() if module else ():
        if isinstance(value, str) and value not in out:
            intrin = TensorIntrin.get(value, allow_missing=True)
            if intrin is not None:
                out[value] = [tvm.ir.save_json(intrin.desc), tvm.ir.save_json(intrin.impl)]
json.dump({"hits": hits, "intrinsics": out}, open(sys.argv[1], "w"))
"""


def _dump(path, cache_dir):
    env = dict(os.environ, TVM_NIMBLE_CACHE_DIR=str(cache_dir))
    subprocess.run([sys.executable, "-c", _DUMP, str(path)], check=True, env=env)
    with open(path) as f:
        return json.load(f)


def test_tensor_intrinsics_from_the_parse_cache_are_tvms_own(tmp_path):
    parsed = _dump(tmp_path / "parsed.json", tmp_path / "cache")  # an empty cache: TVM's parser, then kept
    cached = _dump(tmp_path / "cached.json", tmp_path / "cache")  # a fresh process: from the cache
    assert parsed["hits"] == [0] and cached["hits"][0] >= 100
    assert len(parsed["intrinsics"]) >= 50 and parsed["intrinsics"].keys() == cached["intrinsics"].keys()
    for name, (desc, impl) in parsed["intrinsics"].items():
        again = cached["intrinsics"][name]
        assert tvm_ffi.structural_equal(tvm.ir.load_json(desc), tvm.ir.load_json(again[0]), map_free_vars=True), name
        assert tvm_ffi.structural_equal(tvm.ir.load_json(impl), tvm.ir.load_json(again[1]), map_free_vars=True), name


def test_a_damaged_cache_file_is_parsed_again(tmp_path):
    from tvm_nimble.relay_passes import tvm_compat

    (tmp_path / "cache" / "tvmscript").mkdir(parents=True)
    path = tmp_path / "cache" / "tvmscript" / os.path.basename(tvm_compat.tvmscript_cache_path())
    path.write_text("{not json")
    dumped = _dump(tmp_path / "parsed.json", tmp_path / "cache")
    assert dumped["hits"] == [0] and len(dumped["intrinsics"]) >= 50
    assert len(json.loads(path.read_text())) >= 100  # written whole again
