"""The contract between the compiler side (``relay_passes``, ``codegen``, ``compiler``) and the runtime.

What both sides must spell the same, and nothing else:
  ``tvm_nimble.contract.plan``        the launch plan (plain data with a versioned JSON form) and tensor kinds
  ``tvm_nimble.contract.markers``     the marker calls and embedded functions of a nimble Relax module
  ``tvm_nimble.contract.vendor_abi``  the vendor extension's global function names, by library
  ``tvm_nimble.contract.generation``  a generation step's inputs and KV-cache state names
It imports only the standard library and ``tvm_nimble.errors`` (no TVM), so every layer may import it and it
imports none of them (``tests/test_layering.py``).
"""
