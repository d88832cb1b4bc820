"""The layout a newcomer reads: model.py depends on torch alone, engine/ is split by concern
into documented subpackages with few modules at its root, and no module of the repository
imports, even inside a function, a module that imports it back."""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("caches", "core", "engine", "quantize")


def module_files() -> dict:
    """Every module of the engine's packages and of the top-level tools, by dotted name."""
    files = {p.stem: p for p in ROOT.glob("*.py")}
    files.pop("quantize", None)  # the tool quantize.py; `import quantize` is the package
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return files


def imports(path: Path, names: set) -> set:
    """The repository's modules that a file imports, at its top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in found if n in names}


def test_no_import_circle():
    files = module_files()
    graph = {m: imports(p, set(files)) - {m} for m, p in files.items()}
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = "done"
    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_model_imports_torch_and_the_standard_library_only():
    tree = ast.parse((ROOT / "model.py").read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and n.module}
    assert roots - {"torch", "__future__"} <= set(sys.stdlib_module_names), roots
    assert len((ROOT / "model.py").read_text().splitlines()) <= 350


def test_engine_is_split_by_concern():
    root_modules = [p.name for p in (ROOT / "engine").glob("*.py")]
    assert len(root_modules) <= 8, root_modules
    for pkg in (p for p in (ROOT / "engine").iterdir() if (p / "__init__.py").is_file()):
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) == 1, f"engine/{pkg.name} needs a one-line docstring"


TOY = '''
from caches.base import Option
from caches.streaming import StreamingCache


class ToyCache(StreamingCache):
    """A toy policy: streaming with one option, declared once."""
    description = "a toy policy for the option test"
    options = (Option("toy_strength", float, 0.5, "how much toy", min=0, max=1),)

    def __init__(self, *args, toy_strength: float = 0.5, **kw):
        super().__init__(*args, **kw)
        self.toy_strength = toy_strength
'''


def test_a_policy_declares_its_options_once(tmp_path, monkeypatch):
    """A policy in a module of its own, registered, with one option: the tools' flag, its
    help, --list_caches, the sweep's key and the range check all come from its declaration."""
    import importlib

    import pytest

    import caches
    import generate
    from core.errors import UserError
    from engine.cli import cache_factory_from_args, list_caches
    from engine.evaluation.sweep import parse_policy
    (tmp_path / "toy_policy.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    toy = importlib.import_module("toy_policy")
    monkeypatch.setitem(caches.POLICIES, "toy", toy.ToyCache)

    help_text = " ".join(generate.build_parser().format_help().split())
    assert "--toy_strength" in help_text and "toy: how much toy, in [0, 1]; default 0.5" in help_text
    assert "toy" in list_caches() and "--toy_strength 0.5" in list_caches()
    args = generate.build_parser().parse_args(["--cache", "toy", "--toy_strength", "0.25"])
    assert cache_factory_from_args(args).spec["toy_strength"] == 0.25
    spec = parse_policy({"cache": "toy", "toy_strength": 0.25}, "test")
    assert dict(spec.options) == {"toy_strength": 0.25}
    with pytest.raises(UserError, match=r"`toy_strength` must be in \[0, 1\]"):
        caches.make_cache_factory("toy", toy_strength=2.0)
    with pytest.raises(UserError, match="streaming has no option `toy_strength`"):
        caches.make_cache_factory("streaming", toy_strength=0.1)


def test_the_readme_policy_table_lists_every_policy_and_option():
    from caches import POLICIES
    rows = {line.split("|")[1].strip().strip("`"): line
            for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("| `")}
    for name, cls in POLICIES.items():
        assert name in rows, f"README's policy table has no row for {name}"
        for o in cls.options:
            assert f"--{o.name}" in rows[name], f"README: {name}'s row does not name --{o.name}"
        if name != "full":
            assert "arxiv.org" in rows[name] or "proceedings" in rows[name] or \
                "the same" in rows[name], f"README: {name}'s row names no paper"
