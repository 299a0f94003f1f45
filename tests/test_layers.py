"""The layers hold (issue 14): a walk over every module's imports.

The layers, lowest first::

    checker  <-  adapters  <-  config  <-  lambdas (the runtimes), stacks  <-  the CLI

A module may import its own layer and the layers below it, never one above. The runtimes
(``trainguard.lambdas``) and the stacks (``trainguard.stacks``) share a level and do not
import each other: what both need (the settings, the policy loader) is in config. The
CLI is every other module of the ``trainguard`` package (``trainguard.cli``,
``replay``, ``report``, ``bench``, ``demo``, the package's own ``__init__`` ...): it sits
on top and may import the runtimes (``watch`` runs the local one) and the stacks
(``preflight`` reads environments); nothing below imports it. ``ALLOWED`` lists the
exceptions the issue allows: none.

Which imports count:

* for the layers, every ``import`` and ``from ... import`` anywhere in a file: at module
  level, inside functions and classes (a deferred import is still a dependency), and
  under ``if TYPE_CHECKING:`` (a type from a higher layer ties the layers as much);
* for cycles, the same: one test holds the imports a module runs when it is imported
  (module level, including inside top-level ``if``/``try`` blocks), which would break
  loading, and another holds every import, inside functions and under TYPE_CHECKING too
  (they do not break loading, but they tie two files as much).

An import names one file: ``from trainguard.a import b`` is ``trainguard/a/b.py`` when
that is a module, else ``trainguard/a/__init__.py``. The ``__init__`` files of the
parent packages that Python runs on the way are not edges (every module would otherwise
import its package, which imports it back).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "trainguard"

#: layer -> level; the CLI is every module of the package in none of the named layers
LEVELS = {"checker": 0, "adapters": 1, "config": 2, "lambdas": 3, "stacks": 3, "cli": 4}
#: (importing layer, imported layer) pairs allowed although the rule forbids them: none
ALLOWED: frozenset[tuple[str, str]] = frozenset()

TOP, DEFERRED, TYPING = "module level", "inside a function", "under TYPE_CHECKING"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a file of the package)
    line: int
    where: str  # TOP, DEFERRED or TYPING


@dataclass
class Graph:
    files: dict[str, Path] = field(default_factory=dict)  # module -> its file
    imports: list[Import] = field(default_factory=list)


def package_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, through the layers' links."""
    out: dict[str, Path] = {}
    for top, dirs, names in os.walk(root / package, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = Path(top, name)
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                out[".".join(parts)] = path
    return out


def _statements(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement with where it sits."""
    def walk(body: list[ast.stmt], where: str) -> Iterator[tuple[ast.Import | ast.ImportFrom,
                                                                  str]]:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node, where
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.body, TYPING)
                yield from walk(node.orelse, where)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from ((n, DEFERRED if where == TOP else where) for n in ast.walk(node)
                            if isinstance(n, ast.Import | ast.ImportFrom))
            else:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        yield from walk([child], where)
                    elif isinstance(child, ast.ExceptHandler):
                        yield from walk(child.body, where)
    yield from walk(tree.body, TOP)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             files: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        parts = module.split(".") if is_package else module.split(".")[:-1]
        prefix = ".".join(parts[:len(parts) - node.level + 1])
        base = f"{prefix}.{base}" if node.module else prefix
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        yield sub if sub in files else base


def build_graph(files: dict[str, Path]) -> Graph:
    graph = Graph(files=dict(files))
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, where in _statements(tree):
            for target in _targets(node, module, path.name == "__init__.py", files):
                if target.split(".")[0] != PACKAGE:
                    continue
                while target not in files and "." in target:  # a name in a module
                    target = target.rpartition(".")[0]
                if target in files and target != module:
                    graph.imports.append(Import(module, target, node.lineno, where))
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LEVELS else "cli"


def violations(graph: Graph) -> list[str]:
    """Every import of a layer above the importer's, or across runtimes and stacks."""
    out = []
    for imp in graph.imports:
        a, b = layer(imp.source), layer(imp.target)
        up = LEVELS[b] > LEVELS[a] or (LEVELS[b] == LEVELS[a] and a != b)
        if up and (a, b) not in ALLOWED:
            out.append(f"{graph.files[imp.source]}:{imp.line}: {imp.source} ({a}) imports "
                       f"{imp.target} ({b}) {imp.where}")
    return out


def cycles(graph: Graph, counted: tuple[str, ...] = (TOP,)) -> list[list[str]]:
    """The cycles between files over the imports ``counted`` (Tarjan's strongly connected
    components); by default the import-time ones."""
    edges: dict[str, set[str]] = {}
    for imp in graph.imports:
        if imp.where in counted:
            edges.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is the import chain's: a few dozen
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph.files):
        if v not in index:
            visit(v)
    return found


def private_imports(graph: Graph) -> list[str]:
    """``from <another layer's module> import _name``: a layer's private names stay in it."""
    out = []
    for module, path in graph.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] != PACKAGE or layer(node.module) == layer(module):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{path}:{node.lineno}: {module} imports {node.module}."
                               f"{alias.name}")
    return out


# ------------------------------------------------------------------------- the tree


def tree_graph() -> Graph:
    return build_graph(package_files(ROOT))


def test_the_walk_sees_every_layer_through_its_link() -> None:
    graph = tree_graph()
    seen = {layer(m) for m in graph.files}
    assert seen == set(LEVELS), f"layers not found under trainguard/: {set(LEVELS) - seen}"
    assert "trainguard.config.policy" in graph.files and "trainguard.cli" in graph.files
    # the walk reads imports: the runtimes use config's runtime_policy
    assert "trainguard.config" in {i.target for i in graph.imports
                                   if i.source == "trainguard.lambdas.k8s.cronjob"}


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = violations(tree_graph())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycle_between_files() -> None:
    loops = cycles(tree_graph())
    assert not loops, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in loops)


def test_no_cycle_through_imports_inside_functions_or_for_types() -> None:
    """The bar is no cycle between files at all: an import inside a function or under
    TYPE_CHECKING does not break loading, but it ties two files as much."""
    loops = cycles(tree_graph(), counted=(TOP, DEFERRED, TYPING))
    assert not loops, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in loops)


def test_no_private_name_is_imported_from_another_layer() -> None:
    bad = private_imports(tree_graph())
    assert not bad, "private names imported across layers:\n" + "\n".join(bad)


# ------------------------------------------------------- the checks on planted faults


def plant(root: Path, files: dict[str, str]) -> Graph:
    """A small package in ``root`` (module path -> source) and its graph."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in {p for rel in files for p in (root / rel).parents if root in p.parents}:
        (folder / "__init__.py").touch()
    return build_graph(package_files(root))


def test_an_import_from_a_higher_layer_is_found_wherever_it_sits(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "trainguard/checker/model.py": "X = 1\n",
        "trainguard/checker/rule.py": ("def late():\n"
                                       "    from trainguard.config.policy import load\n"),
        "trainguard/adapters/local.py": ("from typing import TYPE_CHECKING\n"
                                         "if TYPE_CHECKING:\n"
                                         "    from trainguard.lambdas.tick import Report\n"),
        "trainguard/config/policy.py": "from ..checker.model import X\nload = X\n",
        "trainguard/lambdas/tick.py": "from trainguard.stacks import aws\nReport = 1\n",
        "trainguard/stacks/aws.py": "import trainguard.cli\n",
        "trainguard/cli.py": "from trainguard.lambdas.tick import Report\n",
    })
    bad = violations(graph)
    assert len(bad) == 4, bad
    joined = "\n".join(bad)
    assert "rule.py:2: trainguard.checker.rule (checker) imports trainguard.config.policy " \
           f"(config) {DEFERRED}" in joined
    assert f"trainguard.adapters.local (adapters) imports trainguard.lambdas.tick (lambdas) " \
           f"{TYPING}" in joined
    assert "trainguard.lambdas.tick (lambdas) imports trainguard.stacks.aws (stacks)" in joined
    assert "trainguard.stacks.aws (stacks) imports trainguard.cli (cli)" in joined
    # downwards is fine: a relative import from config to checker, the CLI to a runtime
    assert "trainguard.config.policy (config) imports" not in joined
    assert "trainguard.cli (cli) imports" not in joined
    assert Import("trainguard.config.policy", "trainguard.checker.model", 1, TOP) in \
        graph.imports


def test_the_real_tree_with_one_planted_import_fails(tmp_path: Path) -> None:
    """A copy of one real module of the lowest layer, given one import of the CLI."""
    source = (ROOT / "checker" / "policy.py").read_text()
    graph = plant(tmp_path, {
        "trainguard/checker/model.py": (ROOT / "checker" / "model.py").read_text(),
        "trainguard/checker/policy.py": source + "\n\ndef report():\n"
                                                 "    from trainguard import replay\n",
        "trainguard/replay.py": "",
    })
    assert [v.split(": ", 1)[1] for v in violations(graph)] == [
        f"trainguard.checker.policy (checker) imports trainguard.replay (cli) {DEFERRED}"]


def test_a_cycle_between_files_is_found(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "trainguard/adapters/a.py": "from trainguard.adapters import b\n",
        "trainguard/adapters/b.py": "import trainguard.adapters.c\n",
        "trainguard/adapters/c.py": "try:\n    from trainguard.adapters.a import x\n"
                                    "except ImportError:\n    pass\n",
        # deferred: runs after both are loaded, not an import-time loop
        "trainguard/adapters/d.py": "def f():\n    from trainguard.adapters import e\n",
        "trainguard/adapters/e.py": "from trainguard.adapters import d\n",
    })
    assert cycles(graph) == [["trainguard.adapters.a", "trainguard.adapters.b",
                              "trainguard.adapters.c"]]
    assert ["trainguard.adapters.d", "trainguard.adapters.e"] in cycles(
        graph, counted=(TOP, DEFERRED))


def test_a_private_name_from_another_layer_is_found(tmp_path: Path) -> None:
    graph = plant(tmp_path, {
        "trainguard/config/policy.py": "_parse = 1\nload = 2\n",
        "trainguard/stacks/environment.py": "from trainguard.config.policy import _parse, load\n",
        "trainguard/config/other.py": "from trainguard.config.policy import _parse\n",
    })
    assert [p.split(": ", 1)[1] for p in private_imports(graph)] == [
        "trainguard.stacks.environment imports trainguard.config.policy._parse"]
