"""Explain a stream assignment: summary numbers and a Graphviz DOT picture colored by stream."""
from __future__ import annotations

from .stream_assignment import StreamAssignment, _max_matching, reachability, topological_order

PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
           "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]


def dag_width(num_nodes: int, edges) -> int:
    """Largest antichain (Dilworth): n minus a maximum matching on the transitive closure."""
    if num_nodes == 0:
        return 0
    order = topological_order(num_nodes, list(edges))
    reach = reachability(num_nodes, edges, order)
    pairs = [(u, v) for u in range(num_nodes) for v in range(num_nodes) if (reach[u] >> v) & 1]
    return num_nodes - len(_max_matching(num_nodes, num_nodes, pairs))


def critical_path_ops(num_nodes: int, edges) -> int:
    """Number of operators on the longest dependency chain."""
    if num_nodes == 0:
        return 0
    order = topological_order(num_nodes, list(edges))
    succ = [[] for _ in range(num_nodes)]
    for u, v in edges:
        succ[u].append(v)
    longest = [1] * num_nodes
    for u in reversed(order):
        for v in succ[u]:
            longest[u] = max(longest[u], 1 + longest[v])
    return max(longest)


def summarize(num_nodes: int, edges, assignment: StreamAssignment, labels=None) -> dict:
    edges = sorted(set(map(tuple, edges)))
    return {
        "ops": num_nodes,
        "edges": len(edges),
        "reduced_edges": len(assignment.reduced_edges),
        "width": dag_width(num_nodes, edges),
        "streams": assignment.num_streams,
        "syncs": len(assignment.syncs),
        "critical_path_ops": critical_path_ops(num_nodes, edges),
        "nimble_sync_bound": len(assignment.reduced_edges) - assignment.matching_size,
    }


def format_summary(summary: dict) -> str:
    s = summary
    return "\n".join([
        f"operators (kernel launches): {s['ops']}   dependency edges: {s['edges']} "
        f"({s['reduced_edges']} after transitive reduction)",
        f"DAG width (max concurrent ops): {s['width']}   critical path: {s['critical_path_ops']} ops",
        f"streams: {s['streams']}   synchronizations (event waits): {s['syncs']} "
        f"(Nimble's bound |E'|-|M| = {s['nimble_sync_bound']})",
    ])


def _quote(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(num_nodes: int, edges, assignment: StreamAssignment, labels=None, title=None) -> str:
    """Graphviz DOT: nodes filled by stream, G' edges solid, sync edges dashed red."""
    labels = labels or [f"op{i}" for i in range(num_nodes)]
    syncs = set(assignment.syncs)
    lines = ["digraph nimble {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    if title:
        lines.append(f"  label={_quote(title)}; labelloc=t;")
    for v in range(num_nodes):
        s = assignment.stream_of[v]
        label = _quote(f"{labels[v]} (stream {s})")
        lines.append(f"  n{v} [label={label}, fillcolor={_quote(PALETTE[s % len(PALETTE)])}];")
    for u, v in assignment.reduced_edges:
        if (u, v) in syncs:
            lines.append(f'  n{u} -> n{v} [style=dashed, color=red, fontcolor=red, label="sync"];')
        else:
            lines.append(f"  n{u} -> n{v};")
    lines.append("}")
    return "\n".join(lines) + "\n"
