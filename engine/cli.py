"""Shared CLI plumbing: one-line errors, size validators, device/dtype resolution."""
from __future__ import annotations

import argparse
import sys

import torch

from engine.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Parser(argparse.ArgumentParser):
    """argparse that reports bad input on one line (no usage dump) and exits with status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown --device {name!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    # float32 on CPU (bf16 matmuls are slower there for small models), bf16 on GPUs.
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def run(main) -> None:
    """Run a CLI main(); user errors and Ctrl-C end with one line, not a traceback."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
