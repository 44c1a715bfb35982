"""explain --profile on CPU: the one-line refusals (it needs a GPU of the target's arch) and the picture."""

from cli_runner import run_cli
from tvm_nimble import zoo
from tvm_nimble.codegen.schedule_sim import H100, simulate
from tvm_nimble.compiler.build import build
from tvm_nimble.compiler.profile_report import _draw


def test_profile_without_the_gpu_is_one_line(tmp_path):
    path = zoo.save(zoo.get_model("inception"), tmp_path / "incept.onnx")
    for extra, message in (([], "use --target cuda"), (["--target", "cuda", "--arch", "sm_90"], "runs the model on a sm_90 GPU")):
        r = run_cli("explain", path, "--profile", str(tmp_path / "p.png"), *extra)
        assert r.returncode == 1 and message in r.stderr, r.stderr[-400:]
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.png").exists()


def test_the_picture_is_drawn_from_a_timeline(tmp_path):
    plan = build(zoo.get_model("nasnet"), "llvm", max_streams=None, compile_kernels=False).plan
    durations = [4.0 + i % 5 for i in range(len(plan.launches))]
    planned = []
    latency = simulate(plan, durations, None, H100, trace=planned)
    measured = [(l.stream, s / 1e3 * 1.1, e / 1e3 * 1.1) for l, (s, e) in zip(plan.launches, planned)]
    out = tmp_path / "timeline.png"
    _draw(str(out), plan, measured, planned, {0, 1}, latency / 1e3 * 1.1, latency / 1e3)
    assert out.stat().st_size > 5000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
