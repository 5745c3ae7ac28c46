"""The documentation site's generated sections (scripts/docs_hooks.py, run by `mkdocs build`):
the CLI reference names every command and flag the parsers define, the environment page
every setting; a page asking for an unknown section fails the build."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from pygpukit import settings
from pygpukit.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parsers(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) of every parser below the top one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{path} {name}", child
                yield from _parsers(child, f"{path} {name}")


def test_the_cli_reference_has_every_command_and_flag() -> None:
    text = _hooks().cli_reference()
    top = build_parser()
    leaves = [(p, c) for p, c in _parsers(top, "pygpukit") if not list(_parsers(c, p))]
    assert len(leaves) >= 8  # demo, info, cache ls/clear, graph dump/diff/profile, generate
    for path, parser in leaves:
        assert f"## `{path}`" in text, path
        section = text.split(f"## `{path}`", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for flag in action.option_strings:
                # The options every command takes are listed once, at the top.
                where = text if flag in ("-h", "--help", "-v", "--verbose", "-q", "--quiet",
                                         "--debug") else section  # fmt: skip
                assert re.search(rf"[` ]{re.escape(flag)}[ ,`]", where), (path, flag)
            if not action.option_strings and action.dest != "help":
                assert f"`{action.metavar or action.dest}`" in section, (path, action.dest)
    assert "`--version`" in text


def test_the_environment_page_has_every_setting() -> None:
    text = _hooks().settings_reference()
    variables = [
        v
        for k, v in vars(settings).items()
        if k.isupper() and isinstance(v, str) and v.startswith(("PYGPUKIT_", "PGK_"))
    ]
    assert len(variables) >= 12
    for name in variables + ["PYGPUKIT_RUST_PREBUILT"]:
        assert re.search(rf"^\| {name} +\|", text, re.M), name
    assert text.startswith("| Variable")


def test_markers_are_replaced_and_an_unknown_one_fails() -> None:
    hooks = _hooks()
    page = "# CLI\n\n<!-- pygpukit:cli-reference -->\n\nafter\n"
    out = hooks.expand(page, "cli.md")
    assert "<!--" not in out and "## `pygpukit generate`" in out and out.endswith("after\n")
    with pytest.raises(ValueError, match="unknown generated section 'cli-refrence'"):
        hooks.expand("<!-- pygpukit:cli-refrence -->\n", "cli.md")
    for page in ("cli.md", "environment.md"):
        assert re.search(r"^<!-- pygpukit:[a-z-]+ -->$", (ROOT / "docs" / page).read_text(),
                         re.M), page  # fmt: skip
