"""Writing a file whole, and never through a link.

kvsched writes its findings into ``--out``, a folder the code under test can reach: the adapter's
process shares the file system. A link it plants there (``out/counterexamples -> /etc``, or a
file name pointing elsewhere) must not carry a write outside the folder. `write_no_links` takes
an absolute path whose folders were resolved when the run began (so it holds no link of the
user's own) and:

1. opens every folder from ``/`` down with ``O_NOFOLLOW | O_DIRECTORY``, creating the missing
   ones, so a folder swapped for a link is refused (``ELOOP`` or ``ENOTDIR``), never entered;
2. writes a new temporary file in the last folder (``O_CREAT | O_EXCL | O_NOFOLLOW``);
3. renames it over the name, inside that folder: a rename replaces a link, never follows it,
   and a reader never sees half a file.

Any refusal is the `OSError` it is; the caller decides what a file it could not write costs
(the fuzz driver still reports the finding).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def open_folder_no_links(folder: Path) -> int:
    """A descriptor of the absolute ``folder``, each component opened without following a link
    and created when missing; the caller closes it."""
    folder = Path(folder)
    if not folder.is_absolute():
        raise ValueError(f"{folder} is not absolute: resolve it when the run begins")
    fd = os.open(folder.anchor, os.O_RDONLY)
    try:
        for name in folder.parts[1:]:
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened (or refused) below like any other
                inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_no_links(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to the absolute ``path`` whole, through no link (the steps above)."""
    path = Path(path)
    folder = open_folder_no_links(path.parent)
    try:
        temporary = f".{path.name}.{secrets.token_hex(6)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666,
                     dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=folder)
            except OSError:
                pass
            raise
    finally:
        os.close(folder)
    return path


def open_append_no_links(path: Path | str) -> int:
    """A descriptor appending to the absolute ``path`` (created if missing), through no link."""
    path = Path(path)
    folder = open_folder_no_links(path.parent)
    try:
        return os.open(path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666,
                       dir_fd=folder)
    finally:
        os.close(folder)
