"""Explain a stream assignment: summary numbers and a Graphviz DOT picture colored by stream."""
from __future__ import annotations

from .stream_assignment import StreamAssignment, closure_matching_size, topological_order

# A fixed qualitative palette (ColorBrewer Set3); stream s gets PALETTE[s % len(PALETTE)].
PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
           "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]


def dag_width(num_nodes: int, edges) -> int:
    """Largest antichain (Dilworth): nodes minus a maximum matching on the transitive closure."""
    if num_nodes == 0:
        return 0
    return num_nodes - closure_matching_size(num_nodes, edges)


def critical_path_ops(num_nodes: int, edges) -> int:
    """Number of operators on the longest dependency chain (a lower bound on sequential steps)."""
    if num_nodes == 0:
        return 0
    edges = list(edges)
    succ: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in edges:
        succ[u].append(v)
    longest = [1] * num_nodes
    for u in reversed(topological_order(num_nodes, edges)):
        for v in succ[u]:
            longest[u] = max(longest[u], 1 + longest[v])
    return max(longest)


def summarize(num_nodes: int, edges, assignment: StreamAssignment, labels=None) -> dict:
    """Headline numbers of an assignment; width and critical path come from G, not the assignment."""
    edges = sorted({(int(u), int(v)) for u, v in edges})
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
    """A few lines for a terminal."""
    s = summary
    return "\n".join([
        f"operators (kernel launches): {s['ops']}   dependency edges: {s['edges']} "
        f"({s['reduced_edges']} after transitive reduction)",
        f"DAG width (max concurrent ops): {s['width']}   critical path: {s['critical_path_ops']} ops",
        f"streams: {s['streams']}   synchronizations (event waits): {s['syncs']} "
        f"(Nimble's bound |E'|-|M| = {s['nimble_sync_bound']})",
    ])


def _quote(text) -> str:
    """A DOT double-quoted string: escape backslashes and quotes, keep newlines as line breaks."""
    body = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + body.replace("\r\n", "\n").replace("\n", "\\n") + '"'


def to_dot(num_nodes: int, edges, assignment: StreamAssignment, labels=None, title=None) -> str:
    """Graphviz DOT: nodes filled by stream, G' edges solid, sync edges dashed red, a legend."""
    labels = list(labels) if labels is not None else [f"op{i}" for i in range(num_nodes)]
    syncs = set(assignment.syncs)
    lines = ["digraph nimble {", "  rankdir=TB;",
             '  node [shape=box, style="rounded,filled", fontname="Helvetica"];']
    if title:
        lines.append(f"  label={_quote(title)}; labelloc=t;")
    for v in range(num_nodes):
        s = assignment.stream_of[v]
        lines.append(f"  n{v} [label={_quote(f'{labels[v]} (stream {s})')}, "
                     f"fillcolor={_quote(PALETTE[s % len(PALETTE)])}];")
    for u, v in assignment.reduced_edges:
        if (u, v) in syncs:
            lines.append(f'  n{u} -> n{v} [style=dashed, color=red, fontcolor=red, label="sync"];')
        else:
            lines.append(f"  n{u} -> n{v};")
    lines += _legend(assignment.num_streams)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _legend(num_streams: int) -> list[str]:
    """One swatch per stream in a labelled cluster, so colors can be read without the labels."""
    if num_streams == 0:
        return []
    lines = ["  subgraph cluster_legend {", '    label="streams"; style=dashed;']
    for s in range(num_streams):
        lines.append(f"    legend{s} [label={_quote(f'stream {s}')}, fillcolor={_quote(PALETTE[s % len(PALETTE)])}];")
    lines.append("  }")
    return lines
