"""Errors the user can act on."""
from __future__ import annotations

import re

_SETTING = re.compile(r"`([a-z][a-z0-9_]*)`")


class UserError(Exception):
    """Bad input from the user: the CLIs print the message on one line and exit non-zero.

    Library code names a setting by its keyword in backticks (`cache_size`), never by a
    command-line flag; a CLI shows those names as its flags (`as_flags`)."""


def as_flags(message: str) -> str:
    """A library message as a CLI says it: `cache_size` -> --cache_size."""
    return _SETTING.sub(r"--\1", message)
