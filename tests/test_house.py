"""The package's structure stays easy to see: no import cycle among its modules (counting
imports inside functions), no private name used outside its module."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "onnxsplit"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = list(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports():
    """(import graph: module -> modules it imports, anywhere in it; uses of a private
    name of another module as (user, module, name))."""
    mods = _modules()
    graph, private = nx.DiGraph(), []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph.add_node(name)
        imported = {}
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                if not (target or "").startswith("onnxsplit"):
                    continue
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        graph.add_edge(name, f"{target}.{alias.name}")
                        imported[alias.asname or alias.name] = f"{target}.{alias.name}"
                    else:
                        graph.add_edge(name, target)
                        if alias.name.startswith("_"):
                            private.append((name, target, alias.name))
            elif isinstance(node, ast.Import):
                graph.add_edges_from((name, a.name) for a in node.names if a.name.startswith("onnxsplit"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                private.append((name, imported[node.value.id], node.attr))
    # a module's own package (its __init__, run first) is not an import of its
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges) if a == b or a.startswith(b + ".")])
    return graph, private


def test_no_import_cycle_counting_imports_inside_functions():
    graph, _ = _imports()
    assert len(graph) > 40  # the walk found the package
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert cycles == []


def test_no_private_name_is_used_outside_its_module():
    _, private = _imports()
    assert private == []


def test_the_checks_see_a_cycle_and_a_private_use(tmp_path, monkeypatch):
    """The two checks above can fail: a package with both defects is caught."""
    pkg = tmp_path / "onnxsplit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n    return b._hidden\n")
    (pkg / "b.py").write_text("from . import a\n_hidden = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    graph, private = _imports()
    assert [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1] == [["onnxsplit.a",
                                                                                           "onnxsplit.b"]]
    assert private == [("onnxsplit.a", "onnxsplit.b", "_hidden")]
