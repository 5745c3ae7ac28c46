"""`pygpukit graph dump --format html`: the page draws every node of the graph with its
provenance and source line, self-contained; and the layered layout under it."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from html.parser import HTMLParser

import pytest

from pygpukit.cli import main
from pygpukit.cli.graph_layout import assign_layers, layered_layout

MODEL = textwrap.dedent(
    """
    import pygpukit as gpk

    w = gpk.random.normal((64, 32), seed=0)
    b = gpk.random.normal((64,), seed=1)
    g = gpk.random.normal((64,), seed=2)


    def block(x):
        h = gpk.nn.gelu(x @ w.T + b, approximate="tanh")
        n = h * gpk.rsqrt((h * h).mean(-1, keepdims=True) + 1e-6) * g
        return (gpk.exp(n) * 2.0 + n).sum(-1) + gpk.tanh(n).mean(-1)
    """
)


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "model.py"
    p.write_text(MODEL)
    return str(p)


class Page(HTMLParser):
    """The node groups, edges, rectangles and any external reference of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, dict[str, str]] = {}
        self.edges: set[tuple[str, str]] = set()
        self.rects: dict[str, tuple[float, float, float, float, str]] = {}
        self.external: list[tuple[str, str]] = []
        self.scripts = 0
        self._node: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.external += [(tag, a[k]) for k in ("src", "href") if k in a]
        if tag == "link":
            self.external.append((tag, a.get("href", "")))
        if tag == "script":
            self.scripts += 1
        if tag == "g" and "node" in a.get("class", "").split():  # "node on" once hovered
            self._node = a["data-name"]
            self.nodes[self._node] = {k[5:]: v for k, v in a.items() if k.startswith("data-")}
        if tag == "rect" and self._node is not None:
            self.rects[self._node] = (float(a["x"]), float(a["y"]), float(a["width"]),
                                      float(a["height"]), a["fill"])  # fmt: skip
        if tag == "path" and a.get("class") == "edge":
            self.edges.add((a["data-from"], a["data-to"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "g":
            self._node = None


def dump(model: str, capsys, fmt: str, *extra: str) -> str:
    assert main(["graph", "dump", f"{model}:block", "--arg", "f32[4,32]", "--format", fmt,
                 *extra]) == 0  # fmt: skip
    return capsys.readouterr().out


@pytest.mark.parametrize("after", [None, "fuse_rms_norm"])
def test_page_draws_every_node_with_provenance(model, capsys, after):
    extra = ["--after", after] if after else []
    doc = json.loads(dump(model, capsys, "json", *extra))
    want = doc["graphs"][-1]["graph"]["nodes"]  # the same graph, from the JSON dump
    page = Page()
    page.feed(dump(model, capsys, "html", *extra))
    assert sorted(page.nodes) == sorted(n["name"] for n in want)
    lines = MODEL.splitlines()
    for n in want:
        got = page.nodes[n["name"]]
        assert (got["op"], got["origin"], got["loc"]) == (n["op"], n["origin"], n["loc"])
        assert got["pass"] == (n["origin"].split(" from ")[0] if n["origin"] else
                               "input" if n["op"] == "input" else "traced")  # fmt: skip
        if n["loc"]:  # the source line itself, for the hover
            assert got["source"] == lines[int(n["loc"].split(":")[1]) - 1].strip()
    assert page.edges == {(i, n["name"]) for n in want for i in n["inputs"]}
    if after is None:
        assert {"fuse_linear", "fuse_rms_norm", "fuse_elementwise"} <= {
            g["pass"] for g in page.nodes.values()
        }
    # Self-contained: no external reference, one inline script.
    assert page.external == [] and page.scripts == 1
    # Coloured by pass: one colour per pass, a different one for each pass.
    fills: dict[str, set[str]] = {}
    for name, (*_, fill) in page.rects.items():
        fills.setdefault(page.nodes[name]["pass"], set()).add(fill)
    assert all(len(f) == 1 for f in fills.values())
    assert len({f.pop() for f in fills.values()}) == len(fills)
    # Laid out in layers: boxes apart, every edge pointing down the page.
    boxes = list(page.rects.values())
    for i, (x0, y0, w0, h0, _) in enumerate(boxes):
        for x1, y1, w1, h1, _ in boxes[i + 1 :]:
            assert x0 + w0 <= x1 or x1 + w1 <= x0 or y0 + h0 <= y1 or y1 + h1 <= y0
    for src, dst in page.edges:
        assert page.rects[src][1] < page.rects[dst][1]


HOVER_PROBE = """
<script>
// Test only: hover every node and record what the info box then says.
const seen = [];
for (const g of document.querySelectorAll("g.node")) {
  g.dispatchEvent(new MouseEvent("mouseenter"));
  seen.push(g.dataset.name + "|" + (g.classList.contains("on") ? "on" : "off") + "|" +
            document.getElementById("info").textContent.replaceAll("\\n", " / "));
}
const out = document.createElement("pre");
out.id = "probe";
out.textContent = seen.join("\\n");
document.body.appendChild(out);
</script>
"""


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(browser() is None, reason="no headless Chromium (chromium) on PATH")
def test_page_in_headless_chromium(model, capsys, tmp_path):
    """The DOM a browser builds holds every node, and hovering one shows its provenance
    and source line."""
    doc = json.loads(dump(model, capsys, "json"))
    want = doc["graphs"][-1]["graph"]["nodes"]
    html = dump(model, capsys, "html")
    page = tmp_path / "graph.html"
    page.write_text(html.replace("</body>", HOVER_PROBE + "</body>"))
    argv = [str(browser()), "--headless", "--no-sandbox", "--disable-gpu",
            f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Page()
    dom.feed(r.stdout)
    assert sorted(dom.nodes) == sorted(n["name"] for n in want)
    probe = r.stdout.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
    hovered = {ln.split("|", 1)[0]: ln for ln in probe.splitlines()}
    lines = MODEL.splitlines()
    for n in want:
        text = hovered[n["name"]]
        assert text.startswith(f"{n['name']}|on|{n['name']} = {n['op']}")
        assert f"provenance: {n['origin'] or 'traced'}" in text
        if n["loc"]:
            code = lines[int(n["loc"].split(":")[1]) - 1].strip()
            assert f"line: {n['loc']}" in text
            assert code.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in text


def test_layers_follow_the_edges():
    #   a   b        a, b: sources; c = f(a, b); d = f(c); e = f(d, k) with k a late source
    #    \ /
    #     c    k
    names = ["a", "b", "k", "c", "d", "e"]
    inputs = {"a": [], "b": [], "k": [], "c": ["a", "b"], "d": ["c"], "e": ["d", "k"]}
    layer = assign_layers(names, inputs)
    assert all(layer[n] > layer[i] for n in names for i in inputs[n])
    assert (layer["a"], layer["b"], layer["c"], layer["d"], layer["e"]) == (0, 0, 1, 2, 3)
    assert layer["k"] == 2  # just above its only user, not at the top
    pos = layered_layout(names, inputs)
    assert {n: r for n, (r, _) in pos.items()} == layer
    for r in set(layer.values()):  # distinct, centred columns in each layer
        cols = sorted(c for n, (rr, c) in pos.items() if rr == r)
        assert len(set(cols)) == len(cols) and sum(cols) == 0


def test_layout_uncrosses_two_chains():
    # Two independent chains listed crosswise: x0 -> x1, y0 -> y1 with the second layer
    # given in the other order; the sweeps put each child under its parent.
    names = ["x0", "y0", "y1", "x1"]
    inputs = {"x0": [], "y0": [], "y1": ["y0"], "x1": ["x0"]}
    pos = layered_layout(names, inputs)
    assert (pos["x0"][1] < pos["y0"][1]) == (pos["x1"][1] < pos["y1"][1])
