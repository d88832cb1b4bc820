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
