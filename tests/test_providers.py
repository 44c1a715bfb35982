"""Kernel providers as a registry: what each declares, that the choice between them follows the measured
times, and that restricting the providers changes the plan and never the result.

Vendor calls run here as the numpy contract of the vendor extension (tests/vendor_reference.py), so a
model built on llvm with some operators on cuDNN and others on cuBLASLt is checked end to end against
the ONNX reference evaluator.
"""
import itertools
import re

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from tvm_nimble import NimbleExecutor, zoo
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.frontend import from_onnx
from tvm_nimble.compiler.kernel_choice import KernelTiming, choose_providers, record_assignment
from tvm_nimble.errors import NimbleError
from tvm_nimble.relay_passes import providers
from tvm_nimble.relay_passes.providers import Provider, cudnn
from tvm_nimble.relay_passes.vendor_offload import OffloadToVendor, find_offloads
from tvm_nimble.contract.vendor_abi import FUNCTIONS, VENDOR_PREFIXES


def test_every_provider_declares_what_it_takes_and_the_runtime_serves_its_calls():
    names = providers.names()
    assert names[0] == providers.TVM and {"cudnn", "cublaslt"} <= set(names)
    calls = set()
    for name in ("inception", "nasnet", "resnet", "mobilenet"):
        calls |= {(o.provider, str(o.value[0].args[0].global_symbol))
                  for o in find_offloads(from_onnx(zoo.get_model(name))["main"])}
    assert {p for p, _ in calls} == {"cudnn", "cublaslt", "depthwise"}  # depthwise: the max pools cuDNN declines
    for provider_name, call in calls:
        p = providers.get(provider_name)
        assert p.owns(call) and providers.provider_of(call) is p
        assert call.startswith(VENDOR_PREFIXES) and call in FUNCTIONS  # the runtime finds it in the extension
    for p in providers.registered():
        assert p.dtypes and p.targets
        if p.name != providers.TVM:
            assert (p.matchers or p.rewrite) and p.kernel_prefix.startswith(VENDOR_PREFIXES)
            assert p.runtime_library == "vendor"
    assert providers.provider_of("fused_conv2d_add_relu").name == providers.TVM


@pytest.mark.parametrize("only", [("cudnn",), ("cublaslt",), ()])
def test_restricting_the_providers_moves_operators_to_tvm_and_keeps_the_output(only, vendor_reference):
    model = zoo.get_model("inception")
    inputs = zoo.random_inputs(model, seed=0)
    ref = ReferenceEvaluator(model).run(None, inputs)[0]
    other = ReferenceEvaluator(model).run(None, zoo.random_inputs(model, seed=1))[0]
    assert np.abs(ref - other).max() > 1e-3  # the reference depends on the input
    mod = from_onnx(model)
    chosen = [p for p in providers.registered() if p.name in only]
    offloaded = OffloadToVendor(providers=chosen)(mod)
    result = build(offloaded, "llvm", max_streams=None)
    used = {providers.provider_of(l.kernel).name for l in result.plan.launches} - {providers.TVM}
    assert used == set(only)
    out = NimbleExecutor(result)(*inputs.values())[0].numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_the_providers_option_restricts_vendor_kernels_on_cuda():
    from tvm_nimble.codegen.vendor_build import vendor_available

    ok, why = vendor_available()
    if not ok:
        pytest.skip(why)
    model = zoo.get_model("inception")
    for only in (("cudnn",), ("cublaslt",)):
        result = build(model, {"kind": "cuda", "arch": "sm_90"}, kernels="vendor", providers=only,
                       compile_kernels=False)
        used = {providers.provider_of(l.kernel).name for l in result.plan.launches} - {providers.TVM}
        assert used == set(only) and result.report.options.providers == only


def test_an_unknown_provider_is_one_line():
    listed = tuple(n for n in providers.names() if n != providers.TVM)  # every registered one, named or default
    assert {"cudnn", "cublaslt", "attention", "attention_split", "attention_tile",
            "attention_cluster"} <= set(listed)
    with pytest.raises(NimbleError, match=re.escape(f"providers must be names among {listed}, got 'cutlass'") + "$"):
        build(zoo.get_model("inception"), "llvm", providers=("cutlass",))


def _brute_force(anchors: dict, timings: dict) -> dict:
    """anchor -> provider (or None for TVM) with the largest saving tvm_ms - vendor_ms >= 0; ties to the
    provider registered first."""
    out = {}
    for anchor, offers in anchors.items():
        best, best_saving = None, 0.0
        for provider, signature in offers:  # in registration order
            v, t = timings[(provider, signature)]
            if t - v > best_saving or (best is None and t - v >= 0):
                best, best_saving = provider, t - v
        out[anchor] = best
    return out


def test_the_choice_between_providers_follows_the_largest_measured_saving():
    """Two providers taking every convolution (cuDNN, and the same matcher under a second name): for every
    assignment of made-up times to their chains, the choice is the brute-force best per operator."""
    mod = from_onnx(zoo.get_model("resnet"))
    twin = Provider(name="cudnn_twin", title="cuDNN twin", kernel_prefix=cudnn.PROVIDER.kernel_prefix,
                    matchers={"relax.nn.conv2d": cudnn.conv_chain}, dtypes=cudnn.PROVIDER.dtypes)
    pair = [cudnn.PROVIDER, twin]
    per_provider = {p.name: find_offloads(mod["main"], providers=[p]) for p in pair}
    signatures = sorted({o.signature for offs in per_provider.values() for o in offs})
    rng = np.random.default_rng(0)
    for trial in range(20):
        times = {(p.name, s): tuple(rng.choice([0.01, 0.02, 0.03], size=2)) for p in pair for s in signatures}
        timings = [KernelTiming(s, 1, *times[(p.name, s)], provider=p.name)
                   for p in pair for s in {o.signature for o in per_provider[p.name]}]
        chosen = choose_providers(mod, timings, pair, allow_tf32=False)
        anchors: dict = {}
        for p in pair:
            for o in per_provider[p.name]:
                anchors.setdefault(o.anchor, []).append((p.name, o.signature))
        expected = _brute_force(anchors, times)
        for anchor, offers in anchors.items():
            got = {chosen.get(s) for _, s in offers} - {None}
            assert got == ({expected[anchor]} if expected[anchor] else set()), (trial, offers)
        # what the plan reports: each operator once, on the provider that took it (TVM: none did)
        counts = record_assignment(mod, timings, pair, False, chosen)
        winners = [expected[a] or providers.TVM for a in anchors]
        assert counts == {w: winners.count(w) for w in set(winners)}
        by_offer = {offer: expected[a] or providers.TVM for a, offers in anchors.items() for offer in offers}
        assert all(t.taken_by == by_offer[(t.provider, t.signature)] for t in timings)


def test_providers_claim_an_operator_in_registration_order():
    mod = from_onnx(zoo.get_model("resnet"))
    twin = Provider(name="cudnn_twin", title="cuDNN twin", kernel_prefix=cudnn.PROVIDER.kernel_prefix,
                    matchers={"relax.nn.conv2d": cudnn.conv_chain}, dtypes=cudnn.PROVIDER.dtypes)
    for order in itertools.permutations([cudnn.PROVIDER, twin]):
        found = find_offloads(mod["main"], providers=list(order))
        assert {o.provider for o in found if "conv2d" in o.signature} == {order[0].name}
