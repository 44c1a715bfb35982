"""What a generation step is to both sides: the inputs every step of a generator takes, in order, and the name of
each KV-cache state tensor.

``relay_passes.kv_cache`` makes the steps (their cache a ``state`` tensor of the plan, see ``contract.plan``);
``runtime.generator`` fills these inputs at every step and checks a loaded artifact's steps take them.
"""
from __future__ import annotations

#: the inputs every step takes, in order: the new tokens, the mask over the cache's slots, their positions
STEP_INPUTS = ("input_ids", "attention_mask", "position_ids")
#: the state tensor holding layer ``layer``'s keys (``kind`` "key") or values ("value")
STATE_NAME = "kv_cache_{layer}_{kind}"
