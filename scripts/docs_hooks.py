"""MkDocs hooks (mkdocs.yml `hooks:`): the pages' generated sections, built from the code
that owns them so the site cannot drift from it.

A page asks for one with a marker line, replaced at build time:

    <!-- pygpukit:cli-reference -->     every command and flag, from the argparse parsers
    <!-- pygpukit:settings-table -->    every environment variable, from pygpukit/settings.py
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

_MARKER = re.compile(r"^<!-- pygpukit:([a-z-]+) -->$", re.M)

# Options every parser takes (cli._add_common and argparse's own): listed once.
_COMMON = {"-h", "--help", "-v", "--verbose", "-q", "--quiet", "--debug"}


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, Any]]:
    """(name, one-line help, parser) of a parser's subcommands, in registration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return []


def _commands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str, Any]]:
    """Every runnable command below `parser` (leaves of the subcommand tree), depth first."""
    for name, help_, child in _subcommands(parser):
        if _subcommands(child):
            yield from _commands(child, f"{path} {name}")
        else:
            yield f"{path} {name}", help_, child


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.required or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _argument(action: argparse.Action) -> str:
    """How the option is spelt, with its value: `--format {text,json}`, `--arg ARG`."""
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    if action.choices:
        value = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        value = action.metavar or action.dest.upper()
    return f"`{names} {value}`"


_TYPES = {"int": "an integer", "float": "a number"}


def _meaning(action: argparse.Action) -> str:
    parts = []
    if action.help:
        parts.append(action.help)
    if action.type is not None and action.nargs != 0:
        name = getattr(action.type, "__name__", str(action.type))
        parts.append(_TYPES.get(name, name))
    if action.required and action.option_strings:
        parts.append("required")
    if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or ""):
        parts.append("repeatable")
    return "; ".join(parts)


def _usage(parser: argparse.ArgumentParser) -> str:
    """The usage line at a fixed width (argparse otherwise wraps at the terminal's)."""
    formatter = argparse.HelpFormatter(parser.prog, width=88)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, "")
    return formatter.format_help().strip()


def _options_table(actions: list[argparse.Action]) -> list[str]:
    rows = ["| Argument | Default | Meaning |", "|---|---|---|"]
    for a in actions:
        rows.append(f"| {_cell(_argument(a))} | {_cell(_default(a))} | {_cell(_meaning(a))} |")
    return rows


def cli_reference() -> str:
    """Markdown for every `pygpukit` command: its help, usage and arguments, read from
    pygpukit.cli.build_parser()."""
    from pygpukit.cli import build_parser

    top = build_parser()
    common: dict[tuple[str, ...], argparse.Action] = {}
    for a in top._actions:
        if set(a.option_strings) & _COMMON or a.option_strings == ["--version"]:
            common.setdefault(tuple(a.option_strings), a)
    out = ["| Command | What it does |", "|---|---|"]
    for path, help_, _ in _commands(top, "pygpukit"):
        anchor = re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")
        out.append(f"| [`{path}`](#{anchor}) | {_cell(help_)} |")
    out += [
        "",
        "## Options of every command",
        "",
        "They may come before or after the subcommand.",
        "",
        *_options_table(list(common.values())),
        "",
    ]
    for path, help_, parser in _commands(top, "pygpukit"):
        seen: set[tuple[str, ...]] = set()
        own = []
        for a in parser._actions:
            key = tuple(a.option_strings) or (a.dest,)
            if set(a.option_strings) & _COMMON or key in seen:
                continue
            seen.add(key)
            own.append(a)
        usage = _usage(parser)
        out += [f"## `{path}`", ""]
        if help_:
            out += [help_[0].upper() + help_[1:] + ("" if help_.endswith(".") else "."), ""]
        if parser.description and parser.description != help_:
            out += [parser.description, ""]
        out += ["```text", usage, "```", ""]
        out += [*_options_table(own), ""] if own else ["No arguments of its own.", ""]
    return "\n".join(out)


def settings_reference() -> str:
    """Markdown for every setting: the table and notes of pygpukit/settings.py's docstring
    (its first paragraph, the module's summary, left out)."""
    from pygpukit import settings

    doc = inspect.cleandoc(settings.__doc__ or "")
    _, _, rest = doc.partition("\n\n")
    if not rest.lstrip().startswith("| Variable"):
        raise RuntimeError("pygpukit/settings.py: its docstring no longer opens with the table")
    return rest.strip()


GENERATORS: dict[str, Callable[[], str]] = {
    "cli-reference": cli_reference,
    "settings-table": settings_reference,
}


def expand(markdown: str, where: str) -> str:
    """Replace every marker line with its generated Markdown; an unknown marker is an
    error (a typo would otherwise leave a hole in the page)."""

    def one(m: re.Match[str]) -> str:
        make = GENERATORS.get(m.group(1))
        if make is None:
            raise ValueError(f"{where}: unknown generated section {m.group(1)!r}")
        return make()

    return _MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: the page's Markdown, its generated sections filled in."""
    return expand(markdown, page.file.src_path)
