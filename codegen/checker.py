"""Static race checker for a launch plan.

Proves, from the plan alone, that in *every* execution order the GPU may choose (any
interleaving consistent with per-stream program order and the planned events):
  1. every tensor a launch reads was written by a launch that happens before it;
  2. two tensors that share storage never have overlapping lifetimes;
  3. inputs and constants are never written, outputs and states own their storage (a state, which outlives a
     run, may be read before this run writes it).
The executor's CPU race simulator (``tvm_nimble.runtime.race_check``) tests the same property
dynamically; both use :mod:`codegen.happens_before`.
"""
from __future__ import annotations

from .happens_before import access_masks, plan_happens_before, write_ready


def check_plan(plan) -> list[str]:
    """Return the violations found (empty when the plan is safe)."""
    before = plan_happens_before(plan)
    writer, mask = access_masks(((l.idx, l.args, l.writes) for l in plan.launches), plan.root)
    ready = write_ready(((l.idx, l.args, l.writes) for l in plan.launches), plan.root, before)
    writers_of = {}  # reader -> the launches whose bytes it reads
    for w, r in plan.read_after_write():
        writers_of.setdefault(r, []).append(w)
    problems: list[str] = []
    kind = {t.id: t.kind for t in plan.tensors}
    for l in plan.launches:
        for a in l.args:
            r = plan.root(a)
            if a in l.writes:
                if kind[r] in ("input", "const"):
                    problems.append(f"launch {l.idx} ({l.kernel}) writes {kind[r]} tensor t{r}")
                continue
            if kind[r] in ("input", "const", "state"):
                continue
            if r not in writer:
                problems.append(f"launch {l.idx} ({l.kernel}) reads t{r}, which no launch writes")
        for w in writers_of.get(l.idx, ()):
            if not before[l.idx] >> w & 1:
                problems.append(f"launch {l.idx} ({l.kernel}) reads what launch {w} wrote "
                                "without a happens-before edge (missing sync)")
    by_storage: dict[int, list[int]] = {}
    for t in plan.tensors:
        if t.view_of is None:
            by_storage.setdefault(t.storage, []).append(t.id)
    for s, roots in by_storage.items():
        if len(roots) > 1 and any(kind[r] in ("input", "output", "const", "state") for r in roots):
            problems.append(f"storage {s} is shared by an input/output/constant/state tensor: {roots}")
        live = [r for r in roots if r in writer]
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                a_then_b = mask[a] & ~ready[b] == 0
                b_then_a = mask[b] & ~ready[a] == 0
                if not (a_then_b or b_then_a):
                    problems.append(f"tensors t{a} and t{b} share storage {s} but their lifetimes may overlap")
    for o in plan.outputs:
        r = plan.root(o)
        if kind[r] == "intermediate":
            problems.append(f"output t{o} lives in pooled storage {plan.tensors[r].storage}")
    return problems
