import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(__file__).resolve().parent / "data"

from model import ModelArgs, Transformer  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest.ini runs two workers on a 2-core machine: one thread each (and in the processes
    # they start), so that they do not oversubscribe the cores.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def tiny_args(**overrides) -> ModelArgs:
    base = dict(vocab_size=256, n_layer=2, dim=64, n_head=4, n_kv_heads=2, head_dim=16,
                intermediate_size=128, max_position_embeddings=512)
    base.update(overrides)
    return ModelArgs(**base)


def tiny_model(seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(tiny_args(**overrides))
    with torch.no_grad():  # default init is too flat to tell positions apart; widen it
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    return model.eval()


def write_tiny_checkpoint(out: Path, source: Path, **model) -> Path:
    """A real engine checkpoint directory at `out`: source's config format and tokenizer, a tiny
    random model of the given shape (tied head: stored once)."""
    import json
    import shutil

    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((source / "config.json").read_text())
    cfg["model"] = dict(cfg["model"], **model)
    (out / "config.json").write_text(json.dumps(cfg))
    shutil.copy(source / cfg["tokenizer"]["file"], out)
    state = {k: v for k, v in tiny_model(**model).state_dict().items() if k != "output.weight"}
    save_file(state, str(out / "model.safetensors"))
    return out


def convert_in_fresh_home(tmp_path_factory, name: str):
    """An embedded model converted on first use in a fresh REGIONKV_HOME: (home, checkpoint,
    what the conversion printed)."""
    import contextlib
    import io

    from engine.loading.default_model import embedded_checkpoint
    home = tmp_path_factory.mktemp("regionkv_home")
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setenv("REGIONKV_HOME", str(home))
        path = embedded_checkpoint(name)
    return home, path, err.getvalue()


@pytest.fixture(scope="session")
def default_checkpoint():
    """The embedded default model, converted once (REGIONKV_HOME or ~/.cache/regionkv)."""
    from engine.loading.default_model import default_checkpoint as resolve
    return resolve()


def run_cli(script, *args, env=None, timeout=600):
    import subprocess
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT)
