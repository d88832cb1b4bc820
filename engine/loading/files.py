"""Atomic output: write a hidden sibling, then rename it over the target, so neither a reader
nor a Ctrl-C ever sees half a file or half a directory."""
from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from core.errors import UserError


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
    """Fail before a long run, not after it, when `path` could not be written. Creates nothing:
    `path` must not be a directory, and its nearest existing ancestor must be a writable one."""
    path = Path(path).absolute()
    if path.is_dir():
        raise UserError(f"{what} {path} is not a writable file; pass another path")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{what} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: {parent} is not writable")


def save_weights(state: dict, path: Path) -> None:
    """Tensors to a safetensors file (inside a staging directory: atomic once published)."""
    from safetensors.torch import save_file

    save_file({k: t.contiguous() for k, t in state.items()}, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # safetensors creates the file 0600


def write_atomic(path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


@contextmanager
def staging_dir(out: Path) -> Iterator[Path]:
    """A fresh hidden sibling of `out` to build a directory in; removed unless published."""
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        # On success publish_dir has moved it away; on any failure (Ctrl-C included) drop it.
        shutil.rmtree(tmp, ignore_errors=True)


def publish_dir(tmp: Path, out: Path, replace: bool = False) -> None:
    """Rename `tmp` to `out` atomically. A non-empty `out` is swapped out and removed when
    `replace`, else FileExistsError (the caller words the error for its own flags)."""
    try:
        os.rename(tmp, out)  # atomic; also replaces an empty directory
        return
    except OSError:
        if not (out.is_dir() and any(out.iterdir())):
            raise
        if not replace:  # someone else created it while we worked
            raise FileExistsError(str(out)) from None
    old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
