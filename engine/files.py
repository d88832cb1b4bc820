"""Atomic file output: write a hidden sibling, then rename it over the target, so neither a
reader nor a Ctrl-C ever sees half a file."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from engine.errors import UserError


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it replaces `path`, on failure it goes."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def check_writable(path, what: str) -> None:
    """Fail before a long run, not after it, when `path`'s directory cannot be written."""
    parent = Path(path).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{what} {path}: cannot create {parent}: {e.strerror or e}") from None
    if not os.access(parent, os.W_OK):
        raise UserError(f"{what} {path}: {parent} is not writable")


def write_atomic(path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
