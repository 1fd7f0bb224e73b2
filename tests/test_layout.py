"""The package's layout: its folders follow the pipeline, and each imports only from below."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nsconfine

PACKAGE = Path(nsconfine.__file__).parent
# Bottom first: a module may import from its own folder and from any folder before it, never
# from one after it (lazy imports and TYPE_CHECKING imports count: they are edges all the same).
LAYERS = (
    "_text",
    "_digest",
    "_errors",
    "_timeout",
    "_interrupts",
    "_record",
    "_kernel",
    "_plan",
    "_policy",
    "_arguments",
    "_session",
    "_launch",
    "_preflight",
    "_gate",
    "_pool",
    "_export",
    "_selftest",
    "_cli",
    "__init__",
    "aio",
    "bench",
    "__main__",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules path imports, wherever in the file the import is."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _upward_edges(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if LAYERS.index(_layer(target)) > LAYERS.index(_layer(module))
    ]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles (strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_every_module_is_in_a_layer() -> None:
    """Each module of the package sits in one of the layers the layout names."""
    assert sorted({_layer(module) for module in _graph()} - set(LAYERS)) == []


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    """The plan never reaches into a launch, the kernel layer into the plan, and so on."""
    assert _upward_edges(_graph()) == []


def test_the_package_has_no_import_cycle() -> None:
    """No two modules import each other, directly or round a loop."""
    assert _cycles(_graph()) == []


def test_every_module_is_named_in_the_module_map() -> None:
    """docs/development.md's module map names every module of the source tree, so that a
    reader finds any behaviour from it (review of stop 44: five were missing, and a check that
    every launch runs sat in _preflight, which the README calls proved once per binary)."""
    tree = Path(__file__).resolve().parent.parent
    rows = {}
    for line in (tree / "docs" / "development.md").read_text().splitlines():
        if line.startswith("| `"):
            _, names, held, _ = line.split("|", 3)
            rows[names.strip()] = held
    missing = []
    for path in sorted((tree / "nsconfine").rglob("*.py")):
        parts = path.relative_to(tree / "nsconfine").parts
        if len(parts) == 1:
            named = any(f"`{parts[0]}`" in names.split(", ") for names in rows)
        elif path.stem in ("__init__", "__main__"):
            continue
        else:
            named = f"`{path.stem}`" in rows.get(f"`{parts[0]}/`", "")
        if not named:
            missing.append("/".join(parts))
    assert missing == [], missing


def test_the_checks_find_an_upward_edge_and_a_cycle() -> None:
    """The walk above can fail: a kernel module importing the plan is both."""
    graph = _graph()
    graph["nsconfine._kernel.syscalls"].add("nsconfine._plan.model")
    assert "nsconfine._kernel.syscalls -> nsconfine._plan.model" in _upward_edges(graph)
    assert any("nsconfine._kernel.syscalls" in cycle for cycle in _cycles(graph))


def test_the_small_digests_are_sha256_without_hashlib() -> None:
    """nsconfine._digest gives hashlib's sha256 without importing hashlib (which loads
    OpenSSL at every run's start): by the module CPython 3.12 and later keep it in, _sha2,
    or 3.11's _sha256 (review of its first form, which fell back to hashlib from 3.12 on)."""
    import hashlib

    data = b"nsconfine \\xff\\xfe\\0 digest"
    finished = subprocess.run(
        [sys.executable, "-c", "import sys; from nsconfine._digest import sha256_hex; "
         f"print(sha256_hex({data!r}), 'hashlib' in sys.modules)"],
        cwd="/", capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert finished.stdout == f"{hashlib.sha256(data).hexdigest()} False\n"
