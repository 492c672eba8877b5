"""The files a command writes: every path checked before any compute, then written all or none.

:func:`check_output` looks at an output path once, before a model is built, and
refuses with one line naming the flag what could not be written: an empty name,
a name too long for the file system, a directory, a symbolic link to nothing, a
path under a regular file, a missing or unwritable directory (tried by creating
and removing a file there, which fails for every user, root included, on a
read-only file system). :func:`check_distinct` refuses two outputs that are one
file.

:func:`write_all` writes each file to a temporary name in its own directory and
renames them into place (``os.replace``) only once every one was written; on any
failure it removes the temporaries, so no file is left that the command did not
say it wrote.
"""

from __future__ import annotations

import argparse
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .show_args import UsageError, picture_format, shown_path

__all__ = [
    "Output",
    "ShowOutputs",
    "check_distinct",
    "check_input",
    "check_not_input",
    "check_output",
    "show_outputs",
    "shown_path",
    "write_all",
]

_SUFFIX = 16  # the longest suffix a temporary name keeps (writers read the format from it)


@dataclass(frozen=True)
class Output:
    """One output file: the flag that names it, the name given, and where it lands.

    ``target`` is ``path`` itself, or the file a symbolic link ``path`` points to
    (written through the link, as opening the name would).
    """

    option: str
    path: Path
    target: Path


def _why(exc: OSError) -> str:
    """What an OSError from a look at a path means, in words."""
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    if exc.errno == errno.ELOOP:
        return "too many levels of symbolic links"
    return exc.strerror or str(exc)


def _lstat(path: Path, option: str) -> os.stat_result | None:
    """The path's own status (not following a link), None when it does not exist."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"{option}: cannot write {shown_path(path)}: {_why(exc)}") from None


def _named(path_text: str, option: str) -> Path:
    if not path_text.strip():
        raise UsageError(f"{option}: expected a file name, got an empty one")
    if "\0" in path_text:
        raise UsageError(
            f"{option}: a file name cannot hold a NUL character, got {shown_path(repr(path_text))}"
        )
    return Path(path_text).expanduser()


def check_output(path_text: str, option: str) -> Output:
    """The output file ``path_text`` of ``option``, checked writable before any compute.

    Raises:
        UsageError: one line naming ``option``, the path and why it cannot be written.
    """
    path = _named(path_text, option)
    shown = shown_path(path)
    if os.path.basename(path_text) in ("", ".", ".."):  # "out/", "out/.": Path drops the end
        raise UsageError(f"{option}: cannot write {shown_path(path_text)}: a name ending in "
                         f"{path_text[-1]!r} is a directory; give a file name")  # fmt: skip
    target = path
    st = _lstat(path, option)
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(path)
        except OSError as exc:
            missing = exc.errno in (errno.ENOENT, errno.ENOTDIR)
            why = "a symbolic link to a missing file" if missing else _why(exc)
            raise UsageError(f"{option}: cannot write {shown}: {why}") from None
        target = Path(os.path.realpath(path))
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{option}: cannot write {shown}: it is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(
                f"{option}: cannot write {shown}: not a regular file (a device, pipe or socket)"
            )
        if not os.access(target, os.W_OK):
            raise UsageError(f"{option}: cannot write {shown}: permission denied")
    parent = target.parent
    try:
        parent_st = os.stat(parent)
    except FileNotFoundError:
        raise UsageError(
            f"{option}: cannot write {shown}: directory {shown_path(parent)} does not exist"
        ) from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot write {shown}: {_why(exc)}") from None
    if not stat.S_ISDIR(parent_st.st_mode):
        raise UsageError(f"{option}: cannot write {shown}: {shown_path(parent)} is not a directory")
    try:  # the one sure test that the directory takes a new file (root included)
        os.close(_create(probe := _temporary_name(target)))
        os.unlink(probe)
    except OSError as exc:
        why = "permission denied" if exc.errno in (errno.EACCES, errno.EPERM) else _why(exc)
        raise UsageError(
            f"{option}: cannot write {shown}: {why} (in {shown_path(parent)})"
        ) from None
    return Output(option, path, target)


def check_distinct(outputs: Sequence[Output]) -> None:
    """Refuse two outputs that would be the same file."""
    seen: dict[str, Output] = {}
    for out in outputs:
        key = os.path.normcase(os.path.abspath(out.target))
        first = seen.get(key)
        if first is not None:
            raise UsageError(
                f"{out.option}: {shown_path(out.path)} is the same file as {first.option}; "
                "choose another name"
            )
        seen[key] = out


@dataclass(frozen=True)
class ShowOutputs:
    """The files of one ``attnkit show`` run, checked: the page, the picture, the weights."""

    page: Output
    picture: Output | None
    picture_format: str | None  # "png" or "svg"
    weights: Output | None

    def all(self) -> list[Output]:
        """Every output asked for, in the order they are written."""
        return [o for o in (self.page, self.picture, self.weights) if o is not None]


def show_outputs(args: argparse.Namespace) -> ShowOutputs:
    """``--out``, ``--png`` (unless ``--no-png``) and ``--save-weights``, checked before any
    compute: names, suffixes, each path writable, no two the same file."""
    if args.no_png and args.png is not None:
        raise UsageError("--png and --no-png: give one (--no-png writes the page only)")
    page = check_output(args.out, "--out")
    picture = (
        None
        if args.no_png
        else check_output("attention.png" if args.png is None else args.png, "--png")
    )
    fmt = picture_format(picture.path) if picture is not None else None
    weights = None
    if getattr(args, "save_weights", None) is not None:
        weights = check_output(args.save_weights, "--save-weights")
        if weights.path.suffix.lower() not in (".safetensors", ".npz"):
            raise UsageError(
                "--save-weights: expected a file name ending in .safetensors or .npz, got "
                f"{shown_path(weights.path)!r}"
            )
    outputs = ShowOutputs(page, picture, fmt, weights)
    check_distinct(outputs.all())
    for flag, attr in (("--text-file", "text_file"), ("--image", "image")):
        check_not_input(outputs.all(), getattr(args, attr, None), flag)
    for flag, attr in (("--model", "model"), ("--compare-model", "compare_model")):
        check_outside(outputs.all(), getattr(args, attr, None), flag)
    if getattr(args, "model", None) is None and getattr(args, "image", None) is None:
        check_outside(outputs.all(), _default_checkpoint_text(), "the default model")
    return outputs


def _default_checkpoint_text() -> str | None:
    """The default checkpoint's folder, or None when its package is not installed."""
    from ..models.bert.loading import CheckpointError, default_checkpoint

    try:
        return str(default_checkpoint())
    except CheckpointError:
        return None


def check_outside(outputs: Sequence[Output], folder_text: str | None, option: str) -> None:
    """Refuse an output inside the checkpoint folder of ``option`` (it could replace one of
    the model's own files: its weights, config or tokenizer)."""
    if not folder_text or "\0" in folder_text:
        return
    try:
        folder = Path(folder_text).expanduser().resolve()
    except (OSError, RuntimeError):
        return
    for out in outputs:
        try:
            inside = out.target.resolve().is_relative_to(folder)
        except (OSError, RuntimeError):
            continue
        if inside:
            raise UsageError(
                f"{out.option}: {shown_path(out.path)} lies in the checkpoint folder of "
                f"{option}; writing there could overwrite the model's own files; choose "
                "another folder"
            )


def check_not_input(outputs: Sequence[Output], path_text: str | None, option: str) -> None:
    """Refuse an output that is the input file of ``option`` (it would be overwritten)."""
    if not path_text or "\0" in path_text:
        return
    for out in outputs:
        try:
            same = os.path.samefile(out.target, Path(path_text).expanduser())
        except (OSError, ValueError):  # either is missing or unreadable: not the same file
            continue
        if same:
            raise UsageError(
                f"{out.option}: {shown_path(out.path)} is the input file of {option}; writing "
                "it would overwrite the input; choose another name"
            )


def check_input(path_text: str, option: str, *, directory: bool) -> Path:
    """An input path (``--model DIR``, ``--image FILE``) that exists, before any compute.

    Raises:
        UsageError: one line naming ``option``: an empty or too long name, no such
            file or directory, or the other kind of entry than expected.
    """
    path = _named(path_text, option)
    shown = shown_path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        kind = "directory" if directory else "file"
        raise UsageError(f"{option}: {shown}: no such {kind}") from None
    except OSError as exc:
        raise UsageError(f"{option}: cannot read {shown}: {_why(exc)}") from None
    if directory and not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{option}: {shown}: not a directory (a checkpoint is a directory)")
    if not directory and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{option}: {shown}: a directory, not a file")
    return path


def _temporary_name(target: Path) -> Path:
    """A new name beside ``target``: short whatever the target's length, same suffix."""
    suffix = target.suffix if len(target.suffix) <= _SUFFIX else ""
    return target.with_name(f".attnkit-{secrets.token_hex(6)}.tmp{suffix}")


def _create(path: Path) -> int:
    """Create ``path``, which must not exist (mode 0o666 less the umask, as open() gives)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)


def write_all(jobs: Sequence[tuple[Output, Callable[[Path], Any]]]) -> list[Any]:
    """Run each writer on a temporary file beside its output; rename them all once all succeeded.

    Args:
        jobs: (output, writer) pairs; a writer writes the whole file to the path it
            is given (whose suffix is the output's) and may return a value.

    Returns:
        each writer's value, in order, once every file is in place.

    Raises:
        UsageError: a file could not be written (one line naming its flag); the
            temporaries are removed, and every output is as it was before the call
            (an earlier file put back, a new one removed).
    """
    temporaries: list[Path] = []
    placed: list[tuple[Path, Path | None]] = []  # (output, its earlier file kept)
    results: list[Any] = []
    try:
        for out, write in jobs:
            temp = _temporary_name(out.target)
            try:
                fd = _create(temp)
                temporaries.append(temp)
                mode = stat.S_IMODE(os.fstat(fd).st_mode)  # 0o666 less the umask
                os.close(fd)
                if out.target.exists():  # the replaced file's permissions
                    mode = stat.S_IMODE(os.stat(out.target).st_mode)
                results.append(write(temp))
                os.chmod(temp, mode)  # a writer may make the file anew (safetensors: 0o600)
            except OSError as exc:
                raise UsageError(
                    f"{out.option}: cannot write {shown_path(out.path)}: {_why(exc)}"
                ) from None
        written = list(temporaries)
        for (out, _), temp in zip(jobs, written, strict=True):
            kept = _keep_earlier(out.target)
            if kept is not None:
                temporaries.append(kept)  # (removed at the end, as the temporaries)
            try:
                os.replace(temp, out.target)
            except OSError as exc:
                for done, earlier in placed:  # nothing is claimed as written: take them back
                    if earlier is not None:
                        os.replace(earlier, done)  # the earlier file, as it was
                    else:
                        done.unlink(missing_ok=True)
                raise UsageError(
                    f"{out.option}: cannot write {shown_path(out.path)}: {_why(exc)}"
                ) from None
            placed.append((out.target, kept))
    finally:
        for temp in temporaries:
            try:
                temp.unlink(missing_ok=True)
            except OSError:
                pass
    return results


def _keep_earlier(target: Path) -> Path | None:
    """A second name for the file ``target`` holds now (a hard link beside it, else a
    copy), so that a later failed rename can put it back; None when there is none."""
    if not target.is_file():
        return None
    kept = _temporary_name(target)
    try:
        os.link(target, kept)
    except OSError:
        try:
            shutil.copy2(target, kept)
        except OSError:
            return None
    return kept
