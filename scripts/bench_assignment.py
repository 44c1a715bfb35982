"""Time Nimble's stream assignment (+ annotation-free sync computation) on a 1,500-operator DAG.

The graph is shaped like a real network: 150 blocks, alternating Inception-style blocks
(4 branches of 1-3 ops, joined by a concat) and NASNet-style cells (pairwise adds over two
previous outputs), plus random long skip edges. Target: <= 2 s on a 2-core CPU.

    python scripts/bench_assignment.py [--ops 1500]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_nimble.relay_passes.stream_assignment import assign_streams  # noqa: E402


def network_like_dag(target_ops: int, seed: int = 0):
    rng = random.Random(seed)
    edges, n, prev, outs = [], 1, 0, [0]
    while n < target_ops:
        if rng.random() < 0.5:  # inception block
            ends = []
            for length in (1, 2, 3, 2):
                p = prev
                for _ in range(length):
                    edges.append((p, n))
                    p, n = n, n + 1
                ends.append(p)
            edges += [(e, n) for e in ends]
        else:  # nasnet cell over the last two outputs
            h0, h1 = outs[-1], outs[-2] if len(outs) > 1 else outs[-1]
            sums = []
            for _ in range(5):
                a, b = n, n + 1
                edges += [(h0, a), (h1, b), (a, n + 2), (b, n + 2)]
                sums.append(n + 2)
                n += 3
            edges += [(s, n) for s in sums]
        prev = n
        outs.append(n)
        n += 1
        if len(outs) > 3 and rng.random() < 0.3:  # long skip connection
            edges.append((rng.choice(outs[:-2]), prev))
    return n, edges


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=1500)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n, edges = network_like_dag(args.ops)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a = assign_streams(n, edges)
        times.append(time.perf_counter() - t0)
    print(f"nodes {n}  edges {len(edges)}  reduced {len(a.reduced_edges)}  streams {a.num_streams}  "
          f"syncs {len(a.syncs)}  median {statistics.median(times):.3f} s  (cpus: {os.cpu_count()})")


if __name__ == "__main__":
    main()
