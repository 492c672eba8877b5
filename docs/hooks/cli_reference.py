"""mkdocs hook: the reference of the ``attnkit`` command, written from its own parsers.

A page holding the line ``<!-- attnkit-cli -->`` gets, in its place, one section per
subcommand: its summary, its usage and a table of its arguments, each built from the
same ``argparse`` parser that ``attnkit COMMAND --help`` prints, so the page cannot
drift from the command.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

MARKER = "<!-- attnkit-cli -->"


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser ``attnkit NAME`` parses its arguments with (as attnkit.cli.main builds it)."""
    from attnkit import cli

    module_name, summary = cli.COMMANDS[name]
    parser = argparse.ArgumentParser(
        prog=f"attnkit {name}",
        description=summary,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, width=88),
    )
    importlib.import_module(module_name).add_arguments(parser)
    return parser


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes = action.nargs != 0
    metavar = ""
    if takes:
        if action.choices is not None:
            metavar = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            metavar = f" {action.metavar or action.dest.upper()}"
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.nargs == 0 or default is None or default is False or default == argparse.SUPPRESS:
        return ""  # (identity for False: a default of 0 equals False and is shown)
    return f"`{action.default}`"


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument of ``parser`` but ``--help``, in the order ``--help`` lists them."""
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def command_markdown(name: str) -> str:
    """One subcommand's section: summary, usage, a table of its arguments."""
    parser = command_parser(name)
    # The usage as --help prints it, without its "usage: " prefix and that indentation.
    usage = parser.format_usage().strip().removeprefix("usage: ").replace("\n" + " " * 7, "\n")
    lines = [
        f"## `attnkit {name}`",
        "",
        f"{parser.description[0].upper()}{parser.description[1:]}.",
        "",
        "```text",
        usage,
        "```",
        "",
        "| argument | default | what |",
        "|---|---|---|",
    ]
    for action in options(parser):
        help_text = action.help if action.help not in (None, argparse.SUPPRESS) else ""
        help_text = help_text % {"default": action.default} if "%(" in help_text else help_text
        lines.append(f"| {_flags(action)} | {_default(action)} | {_cell(help_text)} |")
    lines += [
        "",
        f"`-h`, `--help` prints this from the command itself: `attnkit {name} --help`.",
        "",
    ]
    return "\n".join(lines)


def cli_markdown() -> str:
    """Every subcommand's section, in the order ``attnkit --help`` lists them."""
    from attnkit import cli

    return "\n".join(command_markdown(name) for name in cli.COMMANDS)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_markdown())
    return markdown
