"""tvm-nimble: ahead-of-time, multi-stream GPU task scheduling for Apache TVM.

Stages: ``tvm_nimble.relay_passes`` (stream assignment on Relax) -> ``tvm_nimble.codegen``
(launch plan, memory plan, artifact) -> ``tvm_nimble`` executor (replay).
"""
import os as _os

# In a source checkout relay_passes/ and codegen/ sit at the repository root (the three stages
# are visible in the tree); an installed wheel puts them inside tvm_nimble/. Make both work.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "relay_passes", "__init__.py")) and _root not in __path__:
    __path__.append(_root)

__version__ = "0.1.0"
