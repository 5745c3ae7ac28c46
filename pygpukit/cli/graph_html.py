"""`pygpukit graph dump --format html`: one self-contained page that draws a graph.

Inline SVG laid out by graph_layout, a few lines of inline JS for hover, no network:
the page opens from disk anywhere. Nodes are coloured by the pass that made them (the
first word of their origin); hovering shows the op, type, provenance and source line.
Input is the dict `graph.graph_json` makes, each node with `source` (its code line).
"""

from __future__ import annotations

from html import escape
from typing import Any

from .graph_layout import layered_layout

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 190, 44, 30, 46, 24
LABEL_CHARS = 27  # what fits in NODE_W at 12px monospace
# Distinct, light enough for black text; a pass gets one by its order of appearance.
PALETTE = ["#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#ffff99", "#8dd3c7",
           "#bebada", "#80b1d3", "#fccde5", "#d9d9d9", "#ccebc5"]  # fmt: skip
TRACED, INPUT = "#ffffff", "#eeeeee"

_STYLE = """
body { font: 13px sans-serif; margin: 16px; }
svg text { font: 12px monospace; pointer-events: none; }
.node rect { stroke: #555; stroke-width: 1; rx: 4; }
.node:hover rect, .node.on rect { stroke: #d00; stroke-width: 2.5; }
.edge { stroke: #888; fill: none; marker-end: url(#arrow); }
#info { position: fixed; right: 16px; top: 16px; max-width: 460px; background: #fffff0;
        border: 1px solid #999; padding: 8px; white-space: pre-wrap; font: 12px monospace; }
.legend span { display: inline-block; padding: 2px 8px; margin: 2px; border: 1px solid #999; }
"""

# Hover: the node's data-* fields in the info box (no library).
_SCRIPT = """
const info = document.getElementById("info");
for (const g of document.querySelectorAll("g.node")) {
  g.addEventListener("mouseenter", () => {
    const d = g.dataset;
    info.textContent = `${d.name} = ${d.op}\\n${d.type}\\nprovenance: ${d.origin || "traced"}` +
      `\\nline: ${d.loc || "-"}${d.source ? "\\n  " + d.source : ""}`;
    g.classList.add("on");
  });
  g.addEventListener("mouseleave", () => g.classList.remove("on"));
}
"""


def node_pass(n: dict[str, Any]) -> str:
    """The pass that made a node (`fuse_linear from permute, ...` -> fuse_linear)."""
    if n["origin"]:
        return str(n["origin"]).split(" from ", 1)[0]
    return "input" if n["op"] == "input" else "traced"


def pass_colours(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """A colour for each pass that made a node; inputs and traced nodes are plain."""
    colours = {"input": INPUT, "traced": TRACED}
    for n in nodes:
        p = node_pass(n)
        if p not in colours:
            colours[p] = PALETTE[(len(colours) - 2) % len(PALETTE)]
    return colours


def _short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 3] + "..."


def _node_svg(n: dict[str, Any], x: float, y: float, colour: str) -> str:
    typ = f"{n['dtype']}[{','.join(str(d) for d in n['shape'])}]"
    data = {"name": n["name"], "op": n["op"], "type": typ, "pass": node_pass(n),
            "origin": n["origin"], "loc": n["loc"], "source": n.get("source", "")}  # fmt: skip
    attrs = " ".join(f'data-{k}="{escape(str(v))}"' for k, v in data.items())
    tip = "\n".join(x for x in (f"{n['name']} = {n['op']} {typ}", n["origin"], n["loc"]) if x)
    return (
        f'<g class="node" id="node-{escape(n["name"])}" {attrs}>'
        f"<title>{escape(tip)}</title>"
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" fill="{colour}"/>'
        f'<text x="{x + 6:.1f}" y="{y + 17:.1f}">{escape(_short(n["name"] + " = " + n["op"]))}'
        f'</text><text x="{x + 6:.1f}" y="{y + 34:.1f}">{escape(_short(typ))}</text></g>'
    )


def graph_page(doc: dict[str, Any], title: str) -> str:
    """The HTML page drawing `doc` (graph_json's dict)."""
    nodes = doc["nodes"]
    names = [n["name"] for n in nodes]
    pos = layered_layout(names, {n["name"]: list(n["inputs"]) for n in nodes})
    min_col = min((c for _, c in pos.values()), default=0.0)
    max_col = max((c for _, c in pos.values()), default=0.0)
    layers = 1 + max((r for r, _ in pos.values()), default=-1)

    def corner(name: str) -> tuple[float, float]:
        r, c = pos[name]
        return MARGIN + (c - min_col) * (NODE_W + GAP_X), MARGIN + r * (NODE_H + GAP_Y)

    width = 2 * MARGIN + (max_col - min_col) * (NODE_W + GAP_X) + NODE_W
    height = 2 * MARGIN + max(layers, 1) * (NODE_H + GAP_Y) - GAP_Y
    colours = pass_colours(nodes)
    edges = []
    for n in nodes:
        x1, y1 = corner(n["name"])
        for src in dict.fromkeys(n["inputs"]):  # x * x: one edge
            x0, y0 = corner(src)
            ax, ay, bx, by = x0 + NODE_W / 2, y0 + NODE_H, x1 + NODE_W / 2, y1 - 3
            mid = (ay + by) / 2
            edges.append(f'<path class="edge" data-from="{escape(src)}" '
                         f'data-to="{escape(n["name"])}" d="M{ax:.1f},{ay:.1f} C{ax:.1f},'
                         f'{mid:.1f} {bx:.1f},{mid:.1f} {bx:.1f},{by:.1f}"/>')  # fmt: skip
    boxes = [_node_svg(n, *corner(n["name"]), colours[node_pass(n)]) for n in nodes]
    legend = "".join(f'<span style="background:{c}">{escape(p)}</span>'
                     for p, c in colours.items()
                     if any(node_pass(n) == p for n in nodes))  # fmt: skip
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h3>{escape(title)}</h3>",
        f'<div class="legend">{legend}</div>',
        '<div id="info">hover a node</div>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#888"/></marker>'
        "</defs>",
        *edges,
        *boxes,
        "</svg>",
        f"<script>{_SCRIPT}</script>",
        "</body></html>",
        "",
    ])  # fmt: skip
