"""Timing through TVM's RPC tracker (compiler/timers.py, runtime/rpc_session.py): a real tracker and a
real `tvm-nimble rpc-server` on 127.0.0.1. Without a GPU here, what can be checked is the path: plans
exported, uploaded, loaded and replayed in the server's session (llvm), the server's answer to "which
GPU do you have", and one-line errors where a GPU or a flag is missing. The GPU run of the same path
(kernels='best' built through a loopback tracker on the H100) is scripts/experiments/remote_best.py."""
import numpy as np
import pytest

from tvm_nimble import build, zoo
from tvm_nimble.compiler.timers import LocalGPU, RemoteGPU, timer_for
from tvm_nimble.compiler.tuning.remote import free_port, loopback_fleet
from tvm_nimble.errors import NimbleError

pytest.importorskip("tornado")  # TVM's tracker needs it; `make test` installs it
KEY = "nimble-timing"


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    with loopback_fleet(1, KEY, str(tmp_path_factory.mktemp("fleet"))) as (address, _):
        yield address


def test_plans_replay_in_the_servers_session_and_a_slower_plan_measures_slower(tracker):
    """Two builds uploaded as artifacts and replayed side by side there: the one with 8x the work per
    convolution (32 vs 4 channels, same graph) must measure slower, so the numbers come from running them."""
    small = build(zoo.get_model("inception", blocks=2, hw=16, channels=4), "llvm", max_streams=1)
    large = build(zoo.get_model("inception", blocks=2, hw=16, channels=32), "llvm", max_streams=1)
    remote = RemoteGPU(tracker, KEY)
    try:
        small_ms, large_ms = remote.replay_ms([small, large]).median()
        assert remote.arch() is None  # the server has no GPU, and says so rather than failing
    finally:
        remote.close()
    assert np.isfinite([small_ms, large_ms]).all() and 0 < small_ms < large_ms


def test_per_launch_timing_needs_a_cuda_build_and_says_so_in_one_line(tracker):
    remote = RemoteGPU(tracker, KEY)
    try:
        with pytest.raises(NimbleError) as err:
            remote.launch_ms(build(zoo.get_model("inception", blocks=1, hw=8), "llvm", max_streams=1), 3)
    finally:
        remote.close()
    assert str(err.value).startswith("on the RPC server:") and "needs a CUDA build" in str(err.value)
    assert "\n" not in str(err.value)


def test_best_through_a_tracker_whose_servers_have_no_such_gpu_is_one_line_before_building(tracker):
    with pytest.raises(NimbleError, match=f"sm_90 GPU, and the RPC server under key '{KEY}' .* has none"):
        build(zoo.get_model("inception"), {"kind": "cuda", "arch": "sm_90"}, kernels="best", compile_kernels=False,
              rpc_tracker=tracker, rpc_key=KEY)


def test_a_wrong_key_an_unreachable_tracker_or_a_missing_flag_is_one_line(tracker):
    with pytest.raises(NimbleError, match="no RPC server is registered under key 'nope'"):
        timer_for(tracker, "nope")
    with pytest.raises(NimbleError, match="cannot reach the RPC tracker"):
        timer_for(f"127.0.0.1:{free_port()}", KEY)
    with pytest.raises(NimbleError, match="needs both the tracker"):
        timer_for(tracker, None)
    assert isinstance(timer_for(None, None), LocalGPU)
