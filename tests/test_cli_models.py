"""The model names the command-line tools and experiments share (tvm_nimble/cli/models.py)."""
import pytest

from tvm_nimble.cli.models import load_model


def test_hf_names_reach_the_hugging_face_builders():
    # an hf: name is a Hugging Face configuration, not a file: an unknown one lists the known ones
    with pytest.raises(ValueError, match="hf:bert-base"):
        load_model("hf:no-such-model")


def test_a_zoo_name_builds_the_benchmark_sized_net():
    name, model = load_model("zoo:inception")
    assert name and model.graph.node


def test_a_bare_zoo_name_is_one_line_naming_the_prefixes():
    from tvm_nimble.errors import NimbleError

    with pytest.raises(NimbleError, match="zoo:incept6"):
        load_model("incept6")
