"""Experiment (CPU): time Nimble's stream assignment (streams + pruned syncs) on a 1,500-operator DAG.

The graph is shaped like a real network: 150 chained blocks of 10 operators, alternating at
random between Inception-style blocks (a stem op, 4 branches of 1/2/3/2 ops, a concat) and
NASNet-style cells (3 pairs of ops over the last two block outputs, summed pairwise, concatenated),
plus random long skip edges from earlier block outputs. Target: <= 2 s on a 2-core CPU.

Findings: no GPU session; the figure in README.md (0.025 s for 1,500 operators) comes from this, run
on the development machine. Raw outputs: none kept (one printed line).

    python scripts/experiments/bench_assignment.py [--blocks 150] [--repeat 5] [--max-streams K]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from tvm_nimble.relay_passes.explain import dag_width
from tvm_nimble.relay_passes.stream_assignment import assign_streams

Edges = list[tuple[int, int]]


def inception_block(first: int, inputs: list[int], edges: Edges) -> int:
    """stem -> branches of 1, 2, 3, 2 ops -> concat; returns the concat (10 ops from ``first``)."""
    stem, nxt, ends = first, first + 1, []
    edges += [(h, stem) for h in inputs[-1:]]
    for length in (1, 2, 3, 2):
        prev = stem
        for _ in range(length):
            edges.append((prev, nxt))
            prev, nxt = nxt, nxt + 1
        ends.append(prev)
    edges += [(e, nxt) for e in ends]
    return nxt


def nasnet_cell(first: int, inputs: list[int], edges: Edges) -> int:
    """3 x (op(h0), op(h1) -> add) -> concat over the last two outputs; returns the concat."""
    h0, h1 = inputs[-1], inputs[-2] if len(inputs) > 1 else inputs[-1]
    nxt, sums = first, []
    for _ in range(3):
        a, b, add = nxt, nxt + 1, nxt + 2
        edges += [(h0, a), (h1, b), (a, add), (b, add)]
        sums.append(add)
        nxt += 3
    edges += [(s, nxt) for s in sums]
    return nxt


def network_like_dag(blocks: int = 150, seed: int = 0) -> tuple[int, Edges]:
    """``blocks`` * 10 operators; about 30% of blocks also get a long skip edge."""
    rng = random.Random(seed)
    edges: Edges = []
    outs: list[int] = []
    n = 0
    for _ in range(blocks):
        make = inception_block if rng.random() < 0.5 or not outs else nasnet_cell
        out = make(n, outs, edges)
        if len(outs) > 2 and rng.random() < 0.3:
            edges.append((rng.choice(outs[:-2]), out))
        outs.append(out)
        n = out + 1
    return n, edges


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--max-streams", type=int, default=None)
    args = ap.parse_args()
    n, edges = network_like_dag(args.blocks)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a = assign_streams(n, edges, max_streams=args.max_streams)
        times.append(time.perf_counter() - t0)
    bound = len(a.reduced_edges) - a.matching_size
    print(f"nodes {n}  edges {len(edges)}  reduced {len(a.reduced_edges)}  width {dag_width(n, edges)}  "
          f"streams {a.num_streams}  syncs {len(a.syncs)} (|E'|-|M| = {bound})  "
          f"median {statistics.median(times):.3f} s of {args.repeat}  (cpus: {os.cpu_count()})")


if __name__ == "__main__":
    main()
