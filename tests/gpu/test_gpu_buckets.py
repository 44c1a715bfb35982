"""A bucketed decoder on the GPU (issue #52): prompts of any length through one artifact, each prompt's ids and mask
padded in page-locked memory and their copies queued on the bucket's stream ahead of its CUDA graph, against the
ONNX reference evaluator at the prompt's own length; lengths alternate long and short, so a short prompt runs on
buffers a longer one filled."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

LENGTHS = (5, 32, 3, 16, 9, 31, 1, 17, 8, 32)


def test_bucketed_decoder_matches_the_reference_at_every_length(gpu_arch):
    from onnx.reference import ReferenceEvaluator

    from tvm_nimble import NimbleExecutor, build
    from tvm_nimble.bench.hf_models import hf_builders

    model = hf_builders("hf:gpt2-tiny")[1](1, dynamic=True)
    built = build(model, {"kind": "cuda", "arch": gpu_arch}, buckets={"batch": [1], "sequence_length": [8, 16, 32]},
                  kernels="tvm")
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(0)
    with NimbleExecutor(built, mode="cuda-graph") as ex:
        for n in LENGTHS:
            ids = rng.integers(0, 256, (1, n), dtype=np.int64)
            mask = np.ones((1, n), np.int64)
            (got,) = ex(ids, mask)
            (want,) = ref.run(None, {"input_ids": ids, "attention_mask": mask})
            assert got.shape == want.shape == (1, n, 256)
            err = float(np.linalg.norm(got.numpy() - want) / np.linalg.norm(want))
            assert err < 1e-4, (n, err)
        assert ex._staging, "the small inputs did not go through page-locked memory"
