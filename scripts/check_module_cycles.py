#!/usr/bin/env python3
"""Fails when the modules of a Rust crate or of a Python package import each other
in a loop. Prints every cycle found and exits 1 if any.

Usage: python3 scripts/check_module_cycles.py [DIR]   (default: src)

Rust (DIR holds `.rs` files, e.g. `src`, `capi/src`): every file is a node
(`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`); an edge `X -> Y` is a `crate::`,
`super::` or `self::` path in X that names module Y (the longest prefix of the path
that is a module). Edges from a module to its own submodules (`mod` declarations and
re-exports of a `mod.rs`) are ignored: a parent re-exporting its children is not a
loop.

Python (DIR is a package, e.g. `python/mooncake_weight_store`): every `.py` file is
a node (`pkg/x.py` is `pkg.x`, `pkg/__init__.py` is `pkg`); an edge `X -> Y` is an
import in X that names module Y of the package: `from . import y`, `from .y import
name`, `from pkg.y import name`, `import pkg.y` (the longest prefix that is a module;
`from . import name` of a non-module name is an edge to the package's `__init__`).
Imports anywhere count, inside functions and methods too (a lazy import is still an
arrow). Only imports under `if TYPE_CHECKING:` are left out: they never run, they
exist for annotations.
"""
import ast
import re
import sys
from pathlib import Path

# --------------------------------------------------------------------------- Rust

path_re = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
group_re = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def resolve_path(modules, mod, path):
    """(module, base, segs) for a `crate::`/`super::`/`self::` path used in module `mod`:
    the longest prefix of the absolute path that is one of `modules` (None when none
    is), the module the path starts from (empty: the crate root) and the segments after
    it."""
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    else:
        base = list(mod)
        # A file `a/b.rs` (module a::b) is the scope of its own items; `super` is `a`.
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    full = base + segs
    for n in range(len(full), 0, -1):
        if tuple(full[:n]) in modules:
            return tuple(full[:n]), base, segs
    return None, base, segs


def rust_graph(src):
    """(modules, edges): edges[m] maps each imported module to a note (unused: "")."""
    modules = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        if parts and parts[0] == "bin":
            continue
        modules[tuple(parts)] = f

    def resolve(mod, path):
        return resolve_path(modules, mod, path)[0]

    edges = {m: {} for m in modules}
    for mod, f in modules.items():
        text = strip_comments(f.read_text())
        paths = []
        for m in group_re.finditer(text):
            prefix, inner = m.group(1), m.group(2)
            for item in re.split(r",", re.sub(r"\{[^{}]*\}", "", inner)):
                item = item.strip().split(" as ")[0].strip()
                if item and item not in ("self", "*"):
                    paths.append(f"{prefix}::{item}")
            paths.append(prefix)
        paths += path_re.findall(text)
        for p in paths:
            target = resolve(mod, p)
            if target is None or target == mod:
                continue
            if target[: len(mod)] == mod:  # own submodule
                continue
            edges[mod].setdefault(target, "")
    return modules, edges, lambda m: "::".join(m) or "crate"


# --------------------------------------------------------------------------- Python


def _is_type_checking(test):
    """`if TYPE_CHECKING:` / `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree):
    """(node, inside a function) of every import that can run (not under TYPE_CHECKING)."""
    out = []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for c in child.orelse:  # the else branch runs
                    walk_one(c, in_function)
                continue
            walk_one(child, in_function)

    def walk_one(child, in_function):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            out.append((child, in_function))
        walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return out


def python_graph(pkg):
    """(modules, edges): edges[m] maps each imported module to where (the first line)."""
    root = pkg.name
    modules = {}
    for f in sorted(pkg.rglob("*.py")):
        rel = f.relative_to(pkg).with_suffix("")
        parts = [root, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[tuple(parts)] = f

    def longest(parts):
        for n in range(len(parts), 0, -1):
            if tuple(parts[:n]) in modules:
                return tuple(parts[:n])
        return None

    edges = {m: {} for m in modules}
    for mod, f in modules.items():
        is_init = f.name == "__init__.py"
        package = list(mod) if is_init else list(mod[:-1])
        targets = []
        for node, in_function in _imports(ast.parse(f.read_text(), str(f))):
            where = f"line {node.lineno}" + (", inside a function" if in_function else "")
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == root:
                        targets.append((longest(alias.name.split(".")), where))
                continue
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == root:
                base = node.module.split(".")
            else:
                continue
            for alias in node.names:
                sub = tuple(base + [alias.name])
                targets.append((sub if sub in modules else longest(base), where))
        for target, where in targets:
            if target is not None and target != mod:
                edges[mod].setdefault(target, where)
    return modules, edges, ".".join


# --------------------------------------------------------------------------- cycles


def strongly_connected(modules, edges):
    """Tarjan's strongly connected components of more than one module."""
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in modules:
        if v not in index:
            visit(v)
    return sccs


def main():
    src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "src")
    python = (src / "__init__.py").is_file()
    modules, edges, name = python_graph(src) if python else rust_graph(src)
    if not modules:
        print(f"no {'Python' if python else 'Rust'} modules found in {src}")
        sys.exit(1)
    sccs = strongly_connected(modules, edges)
    if sccs:
        for comp in sccs:
            members = set(comp)
            print("import loop:", ", ".join(sorted(name(m) for m in comp)))
            for m in sorted(comp):
                for t in sorted(set(edges[m]) & members):
                    note = f" ({edges[m][t]})" if edges[m][t] else ""
                    print(f"    {name(m)} -> {name(t)}{note}")
        sys.exit(1)
    arrows = sum(len(e) for e in edges.values())
    kind = "Python" if python else "Rust"
    print(f"no import loop among {len(modules)} {kind} modules ({arrows} arrows) of {src}")


if __name__ == "__main__":
    main()
