"""The library's shape: no module in audit/ over 600 lines, no import cycle between its modules,
and imports that point down the layers only (LAYERS: which subpackage may import which).

The import graph is read statically (ast), so an import inside a function counts as much as
one at the top of a module: it runs, just later, and a cycle through it still ties the two
modules together. Edges: `from .x import`, `from . import x`, `from audit.x import`,
`import audit.x`, at any nesting level, with relative imports inside subpackages resolved
against the importing module's own package.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

AUDIT = Path(__file__).resolve().parent.parent / "audit"
MAX_LINES = 600

# Which subpackage of audit/ may import which (audit/__init__.py says what each holds). Lowest
# first: a layer imports only layers listed before it, so data flows one way, from cells to
# records to findings to the report.
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "workload": {"core"},
    "measure": {"core", "workload"},
    "plan": {"core", "workload", "measure"},          # constants and the machine's ceilings ...
    "analysis": {"core", "workload"},                # the known mistakes' explanations (workload.mistakes), no torch
    "render": {"core", "workload", "analysis"},       # records and findings only: no torch
    "repro": {"core", "workload", "measure", "analysis"},
    "execute": {"core", "workload", "measure", "plan", "analysis", "repro"},   # shrinking writes minimal scripts
    "commands": {"core", "workload", "measure", "plan", "analysis", "render", "repro", "execute"},
}
# ... but never what measures a cell: plan predicts cells, it does not run them. Each entry a module or
# a package (then every module under it); each must exist (test_every_never_entry_is_a_module), or a
# move would quietly stop forbidding it.
NEVER = {"plan": {"audit.measure.cell", "audit.measure.checks", "audit.measure.referee", "audit.measure.seed"}}
# The package's top: its API (audit.adapt is workload's) and the command line dispatch to commands.
TOP = {"audit": {"core", "workload", "commands"}, "audit.cli": {"core", "commands"}, "audit.__main__": {"audit.cli"}}
# Layers whose modules never import torch, not even inside a function: they read records.
TORCH_FREE = ("core", "analysis", "render")


def module_files(root: Path) -> dict[str, Path]:
    """{dotted module name: file} of every .py under the package `root` (subpackages too)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name` if it is one of the modules, else its nearest enclosing module (or None)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules among `modules` that `module` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    root = next(iter(modules)).split(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == root or alias.name.startswith(root + "."):
                    found.add(_known(alias.name, modules))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            elif node.module and (node.module == root or node.module.startswith(root + ".")):
                base = node.module
            else:
                continue
            for alias in node.names:             # `from pkg import submodule` imports the submodule
                found.add(_known(f"{base}.{alias.name}", modules) if f"{base}.{alias.name}" in modules
                          else _known(base, modules))
    found.discard(None)
    found.discard(module)
    return found


def modules_over(root: Path, limit: int) -> dict[str, int]:
    """{module: line count} of the modules under `root` longer than `limit` lines."""
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines())
               for name, path in module_files(root).items()}
    return {name: n for name, n in lengths.items() if n > limit}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles (a -> b -> ... -> a): in every strongly connected component, the shortest through
    each of its modules, so every module caught in one is named."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:              # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)

    out: list[list[str]] = []
    for component in components:
        members = set(component)
        for start in component:
            cycle = _shortest_cycle(graph, members, start)
            first = cycle.index(min(cycle[:-1]))
            cycle = cycle[first:-1] + cycle[:first] + [cycle[first]]   # the same cycle starts alike
            if cycle not in out:
                out.append(cycle)
    return out


def _shortest_cycle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """start -> ... -> start inside one strongly connected component (breadth first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while start not in parent:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt not in parent:
                    parent[nxt] = node
                    following.append(nxt)
        frontier = following
    path = [start]
    node = parent[start]
    while node != start:
        path.append(node)
        node = parent[node]
    return [start, *reversed(path[1:]), start]


# --------------------------------------------------------------------------- the library

def test_no_module_in_audit_is_over_600_lines():
    assert len(module_files(AUDIT)) > 10, "audit/ was not found"
    too_long = modules_over(AUDIT, MAX_LINES)
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


def test_audit_has_no_import_cycle():
    graph = import_graph(AUDIT)
    assert graph["audit.cli"], "no imports found: the graph reader is broken"
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def layer_of(module: str) -> str:
    """The subpackage a module belongs to ("audit.plan.budget" -> "plan"), or the module
    itself for the package's top (audit, audit.cli, audit.__main__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else module


def layer_violations(graph: dict[str, set[str]], layers: dict[str, set[str]] = LAYERS,
                     top: dict[str, set[str]] = TOP, never: dict[str, set[str]] = NEVER) -> list[str]:
    """"importer -> imported" for every import the layer table does not allow."""
    found = []
    for module, imported in sorted(graph.items()):
        mine = layer_of(module)
        allowed = layers.get(mine, top.get(module))
        if allowed is None:
            found.append(f"{module}: in no layer (add its subpackage to LAYERS)")
            continue
        for other in sorted(imported):
            theirs = layer_of(other)
            if theirs == mine:
                continue
            if (theirs not in allowed and other not in allowed) or never_imports(other, never.get(mine, ())):
                found.append(f"{module} -> {other}")
    return found


def never_imports(module: str, never: Sequence[str] | set[str]) -> bool:
    """Whether `module` is one of `never`, or inside a package of it."""
    return any(module == name or module.startswith(name + ".") for name in never)


def torch_importers(root: Path, layers: Sequence[str]) -> list[str]:
    """Modules of `layers` under `root` that import torch anywhere in their source."""
    found = []
    for name, path in module_files(root).items():
        if layer_of(name) not in layers:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                found.append(name)
                break
    return sorted(found)


def test_imports_point_down_the_layers():
    graph = import_graph(AUDIT)
    assert {layer_of(m) for m in graph} >= set(LAYERS), "a layer of LAYERS has no module"
    violations = layer_violations(graph)
    assert not violations, "imports against the layer table (LAYERS): " + "; ".join(violations)


def test_every_never_entry_is_a_module():
    """NEVER names modules and packages that exist: one left behind by a move forbids nothing."""
    modules = module_files(AUDIT)
    for layer, names in NEVER.items():
        assert layer in LAYERS, layer
        missing = sorted(name for name in names if name not in modules)
        assert not missing, f"NEVER[{layer!r}] names modules that do not exist: {missing}"


def test_a_never_package_forbids_every_module_under_it():
    graph = {"pkg.plan.a": {"pkg.measure.cell.phases", "pkg.measure.celluar"}, "pkg.plan": set(),
             "pkg.measure.cell.phases": set(), "pkg.measure.celluar": set(), "pkg.measure.cell": set()}
    found = layer_violations(graph, layers={"measure": set(), "plan": {"measure"}}, top={"pkg": set()},
                             never={"plan": {"pkg.measure.cell"}})
    assert found == ["pkg.plan.a -> pkg.measure.cell.phases"]


def test_every_package_is_installed():
    """pyproject's packages list every package of audit/, subpackages too: one missing there is left out of
    an installed audit (its modules import from a checkout, not from a wheel)."""
    text = (AUDIT.parent / "pyproject.toml").read_text(encoding="utf-8")
    listed = set(re.findall(r'"([\w.]+)"', re.search(r"^packages = \[(.*?)\]", text, re.M | re.S).group(1)))
    packages = {name for name, path in module_files(AUDIT).items() if path.name == "__init__.py"}
    assert packages == listed, f"not in pyproject: {sorted(packages - listed)}; not packages: {sorted(listed - packages)}"


def test_the_layers_are_ordered():
    """Each layer may import only layers before it in LAYERS: the table itself points down."""
    order = list(LAYERS)
    for name, allowed in LAYERS.items():
        assert all(order.index(a) < order.index(name) for a in allowed), name


def declared_imports(docstring: str, layers: Sequence[str]) -> set[str] | None:
    """The layers a subpackage's docstring says it may import ("May import core, workload.";
    "Imports nothing else of audit."; "May import every layer."), or None when it says not."""
    text = " ".join(docstring.split())
    if "Imports nothing else" in text:
        return set()
    found = re.search(r"May import ([^.;(]*)", text)
    if not found:
        return None
    if "every layer" in found.group(1):
        return set(layers)
    return {w for w in re.split(r"[\s,]+", found.group(1)) if w in layers}


def test_each_layer_says_what_it_holds_and_may_import():
    """Its __init__ docstring, as the table has it."""
    for name, allowed in LAYERS.items():
        doc = ast.get_docstring(ast.parse((AUDIT / name / "__init__.py").read_text(encoding="utf-8")))
        assert doc, f"audit/{name}/__init__.py has no docstring"
        below = list(LAYERS)[:list(LAYERS).index(name)]
        assert declared_imports(doc, below) == allowed, name


def test_the_record_reading_layers_never_import_torch():
    assert not torch_importers(AUDIT, TORCH_FREE)


def test_the_command_line_starts_without_torch_pandas_or_numpy():
    """`audit deps` installs them, so it must run where they are missing."""
    code = ("import sys\n"
            "for name in ('torch', 'pandas', 'numpy', 'matplotlib'):\n"
            "    sys.modules[name] = None\n"
            "from audit import cli\n"
            "cli.build_parser().parse_args(['deps', '--test'])\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=AUDIT.parent, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# --------------------------------------------------------------------------- the checks themselves

def test_a_planted_upward_import_is_found(tmp_path):
    """A copy of audit/ with one import planted against the table: report's data module
    importing the runner (render -> execute) is caught, and so is plan importing the cell
    measurement; the unchanged copy passes."""
    import shutil
    copy = tmp_path / "audit"
    shutil.copytree(AUDIT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert layer_violations(import_graph(copy)) == []
    data = copy / "render" / "data.py"
    data.write_text(data.read_text() + "\n\ndef _planted():\n    from ..execute import runner\n")
    budget = copy / "plan" / "budget.py"
    budget.write_text(budget.read_text()
                      + "\n\ndef _planted():\n    from ..measure.cell.measurement import measure_cell\n")
    assert layer_violations(import_graph(copy)) == ["audit.plan.budget -> audit.measure.cell.measurement",
                                                     "audit.render.data -> audit.execute.runner"]


def test_a_module_outside_every_layer_is_found(tmp_path):
    root = _package(tmp_path, {"core/__init__.py": "", "core/a.py": "", "stray/__init__.py": "",
                               "stray/b.py": "from ..core import a\n"})
    found = layer_violations(import_graph(root), layers={"core": set()}, top={"pkg": set()}, never={})
    assert found == ["pkg.stray: in no layer (add its subpackage to LAYERS)",
                     "pkg.stray.b: in no layer (add its subpackage to LAYERS)"]


def test_torch_in_a_function_of_a_torch_free_layer_is_found(tmp_path):
    root = _package(tmp_path, {"render/__init__.py": "", "render/a.py": "def f():\n    import torch.nn\n",
                               "render/b.py": "import os\n", "measure/__init__.py": "",
                               "measure/c.py": "import torch\n"})
    assert torch_importers(root, ("render",)) == ["pkg.render.a"]

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_graph_resolves_every_import_form(tmp_path):
    root = _package(tmp_path, {
        "a.py": "from .b import x\nimport pkg.c\n",
        "b.py": "def f():\n    from . import c\n    from pkg import d\n",
        "c.py": "from pkg.sub.e import y\n",
        "d.py": "import os\nfrom collections import deque\n",
        "sub/__init__.py": "",
        "sub/e.py": "from ..d import z\nfrom . import f\n",
        "sub/f.py": "class K:\n    def m(self):\n        from .. import a\n",
    })
    assert import_graph(root) == {
        "pkg": set(), "pkg.a": {"pkg.b", "pkg.c"}, "pkg.b": {"pkg.c", "pkg.d"}, "pkg.c": {"pkg.sub.e"},
        "pkg.d": set(), "pkg.sub": set(), "pkg.sub.e": {"pkg.d", "pkg.sub.f"}, "pkg.sub.f": {"pkg.a"},
    }


def test_a_cycle_through_a_function_level_import_in_a_subpackage_is_found(tmp_path):
    root = _package(tmp_path, {
        "a.py": "from .sub.e import y\n",
        "b.py": "",
        "sub/__init__.py": "",
        "sub/e.py": "def f():\n    from ..a import x\n",
    })
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.sub.e", "pkg.a"]]


def test_an_acyclic_graph_has_no_cycle():
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"], ["a", "c", "a"]]


def test_a_long_module_in_a_subpackage_is_found(tmp_path):
    root = _package(tmp_path, {"ok.py": "x = 1\n" * MAX_LINES, "sub/__init__.py": "",
                               "sub/long.py": "x = 1\n" * (MAX_LINES + 1)})
    assert modules_over(root, MAX_LINES) == {"pkg.sub.long": MAX_LINES + 1}


# The tests whose outcome rests on floating-point results that CI runs again under the other CPU kinds
# (issue 54: a diagnosis flipped with ATen's vectorised kernels, and CI ran on one CPU kind only).
CPU_KINDS_MODULES = ("test_diagnosis", "test_arguments", "test_layouts", "test_gradients", "test_lse")


def test_the_floating_point_tests_run_again_under_every_emulated_cpu_kind():
    """Each module of CPU_KINDS_MODULES is marked cpu_kinds, and `make test` runs the marked tests under
    ATen's kernels without a vector ISA and as an AVX2-only CPU (oneDNN's matmul too)."""
    tests = Path(__file__).resolve().parent
    for name in CPU_KINDS_MODULES:
        assert re.search(r"^pytestmark = pytest\.mark\.cpu_kinds", (tests / f"{name}.py").read_text(), re.M), name
    makefile = (tests.parent / "Makefile").read_text()
    emulated = re.search(r"^EMULATED_CPUS \?= (.+)$", makefile, re.M).group(1).split(";")
    assert {"ATEN_CPU_CAPABILITY=default", "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"} <= set(emulated)
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "test-cpu-kinds-here" in recipe and "emulated != 0" in recipe
