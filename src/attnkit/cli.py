"""The ``attnkit`` command: one module per subcommand (attnkit.commands), imported when used.

Each subcommand module exposes ``DESCRIPTION``, ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status). Bad input exits with status 2 and one
clear line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("attnkit.commands.demo", "walk through Nadaraya–Watson, valid_lens masks, dispatch"),
    "explain": ("attnkit.commands.explain", "which backend runs a call of given shapes, and why"),
    "show": ("attnkit.commands.show", "a real model's attention as a web page and a picture"),
    "bench": ("attnkit.commands.bench", "benchmarks side by side with torch SDPA and plain math"),
}


TOP_LEVEL_OPTIONS: dict[str, str] = {
    "-h, --help": "print this message and exit",
    "-V, --version": "print attnkit's version and exit",
}
"""The options ``attnkit`` takes before a command (none has a value, so none a default)."""


def _usage() -> str:
    width = max(len(n) for n in [*COMMANDS, *TOP_LEVEL_OPTIONS])
    lines = ["usage: attnkit COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "options:"]
    lines += [f"  {flags:<{width}}  {what}" for flags, what in TOP_LEVEL_OPTIONS.items()]
    lines += ["", "Run 'attnkit COMMAND --help' for a command's options."]
    return "\n".join(lines)


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``attnkit`` console script."""
    for stream in (sys.stdout, sys.stderr):
        # A console or file that is not UTF-8 (Windows' cp1252, an ASCII locale) gets a
        # character it cannot write as an escape, not a UnicodeEncodeError.
        if isinstance(stream, io.TextIOWrapper) and "utf" not in (stream.encoding or "").lower():
            stream.reconfigure(errors="backslashreplace")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_usage(), file=sys.stderr)  # (a usage error: no command)
        return 2
    if args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from . import __version__

        print(f"attnkit {__version__}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        print(
            f"attnkit: error: unknown command {name!r}; expected one of {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    parser = _ArgumentParser(prog=f"attnkit {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    try:
        ns = parser.parse_args(args[1:])
    except SystemExit as exc:  # --help (0) or a bad argument (2, one line already printed)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return int(module.run(ns))
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as shell tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (the exit's flush has nowhere to fail)
        return 1
    except KeyboardInterrupt:
        print(f"attnkit {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
