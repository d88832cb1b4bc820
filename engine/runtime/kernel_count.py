"""Kernels a compiled step launches, counted in the code Inductor generates for it: C++ kernels on
the CPU, Triton kernels on CUDA, plus the library calls (matrix products, fallbacks) between them.

On a GPU at small shapes a decode step is bound by how many kernels it runs, not by the bytes
they read, so the count is the figure a policy's bookkeeping is judged by; the CPU can check it
without a GPU, since Inductor fuses the same graph on both (the C++ backend more aggressively)."""
import ast
import contextlib
from unittest import mock

# What a generated wrapper calls that is a kernel launch besides its own kernels: the library's
# products and attention, operators Inductor falls back to, and copies back into mutated inputs.
LIBRARY_PREFIXES = ("extern_kernels.", "torch.ops.", "aten.")
LAUNCHING_METHODS = ("copy_",)


@contextlib.contextmanager
def generated_code():
    """Collects the wrapper code of every graph Inductor compiles (or loads from its caches)
    inside the block: `with generated_code() as codes: ...`."""
    from torch._inductor.graph import GraphLowering
    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append):
        yield codes


def launches(code: str) -> int:
    """Kernel launches in one call of a generated graph: each of its kernels, library calls and
    copies, and those of each nested region (a subgraph called once a layer) times its calls."""
    tree = ast.parse(code)
    kernels, functions = set(), {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func).startswith("async_compile."):
            kernels.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):  # the Runner: its `call` is the entry
            functions.update((f"{node.name}.{f.name}", f) for f in node.body
                             if isinstance(f, ast.FunctionDef))
    entry = functions.get("Runner.call") or functions.get("call")
    if entry is None:
        raise ValueError("no `call` entry in the generated code")

    def count(fn: ast.FunctionDef) -> int:
        n = 0
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = ast.unparse(f)
            if isinstance(f, ast.Name) and f.id in kernels:  # a C++ kernel
                n += 1
            elif isinstance(f, ast.Attribute) and f.attr == "run" \
                    and isinstance(f.value, ast.Name) and f.value.id in kernels:  # Triton
                n += 1
            elif name.startswith(LIBRARY_PREFIXES):
                n += 1
            elif isinstance(f, ast.Attribute) and f.attr in LAUNCHING_METHODS:
                n += 1
            elif isinstance(f, ast.Name) and f.id in functions and f.id != fn.name:
                n += count(functions[f.id])
        return n
    return count(entry)


def step_launches(codes: list) -> int:
    """The decode step's launches among the graphs a warm-up compiled: the step holds every
    layer's work, so it is the largest (a prompt's compression graphs hold only part of it)."""
    return max((launches(c) for c in codes), default=0)
