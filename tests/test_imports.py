"""The package's imports point one way: ops <- nn <- models <- the tools on top (bench, demo, the command line), with
no cycle anywhere, function-local imports included. Read from the source with ast, so a cycle hidden inside a function
is found too."""
import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytransformer"
# Layer of each top-level part of the package: a module may import from its own layer and the ones below.
LAYERS = {"_C": 0, "ops": 0, "nn": 1, "training": 1, "models": 2, "quantization": 3, "integrations": 3, "bench": 4,
          "demo": 4, "plotting": 4, "check": 4, "__main__": 4, "": 4}  # "": the package's __init__


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def imports(path: Path) -> set[str]:
    """The package modules that the file imports, at any depth of its code."""
    name, found = module_name(path), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "pytransformer"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").split(".")[0] == "pytransformer":
                base = node.module
            else:
                continue
            for alias in node.names:  # `from .. import ops` imports the module pytransformer.ops
                found.add(f"{base}.{alias.name}" if is_module(f"{base}.{alias.name}") else base)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else ""]


def test_imports_point_down_the_layers():
    upward = {m: sorted(t for t in targets if layer(t) > layer(m)) for m, targets in graph().items()}
    assert {m: t for m, t in upward.items() if t} == {}


def test_no_import_cycles():
    edges, state, cycles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if nxt == node:
                continue
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_package_imports_in_a_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", "import pytransformer.models, pytransformer.bench.suite"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
