"""Print dpool's package-level import graph and module sizes (the architecture at a glance).

    python bench/import_graph.py            # edges "package -> package  (number of imports)"
    python bench/import_graph.py --dot      # the same as Graphviz dot (| dot -Tpng > g.png)

Imports inside functions count too. The layer order these edges must respect is checked by
tests/test_architecture.py.
"""

from __future__ import annotations

import argparse
import ast
import collections
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dpool")


def _modules() -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def _imports(module: str, path: str) -> set[str]:
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {n for n in found if n == "dpool" or n.startswith("dpool.")}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(dpool)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dot", action="store_true")
    args = ap.parse_args()
    edges: collections.Counter = collections.Counter()
    sizes: collections.Counter = collections.Counter()
    for module, path in _modules().items():
        sizes[_package(module)] += sum(1 for _ in open(path))
        for imported in _imports(module, path):
            a, b = _package(module), _package(imported)
            if a != b:
                edges[(a, b)] += 1
    if args.dot:
        print("digraph dpool {")
        for (a, b), n in sorted(edges.items()):
            print(f'  "{a}" -> "{b}" [label={n}];')
        print("}")
        return
    for (a, b), n in sorted(edges.items()):
        print(f"{a:18} -> {b:18} {n}")
    print()
    for pkg, lines in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"{pkg:18} {lines:6d} lines")


if __name__ == "__main__":
    main()
