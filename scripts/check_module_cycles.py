#!/usr/bin/env python3
"""Fails when the modules of src/ import each other in a loop.

Every file under src/ is a node (`src/a/b.rs` and `src/a/b/mod.rs` are `a::b`); an
edge `X -> Y` is a `crate::`, `super::` or `self::` path in X that names module Y (the
longest prefix of the path that is a module). Edges from a module to its own
submodules (`mod` declarations and re-exports of a `mod.rs`) are ignored: a parent
re-exporting its children is not a loop. Prints every cycle found and exits 1 if any.
Usage: python3 scripts/check_module_cycles.py [SRC_DIR]
"""
import re
import sys
from pathlib import Path

src = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "src")
modules = {}
for f in sorted(src.rglob("*.rs")):
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    if parts and parts[0] == "bin":
        continue
    modules[tuple(parts)] = f

path_re = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
group_re = re.compile(r"\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def resolve(mod, path):
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
            return tuple(full[:n])
    return None


edges = {m: set() for m in modules}
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
        edges[mod].add(target)

# Tarjan's strongly connected components.
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

name = lambda m: "::".join(m) or "crate"
if sccs:
    for comp in sccs:
        members = set(comp)
        print("import loop:", ", ".join(sorted(name(m) for m in comp)))
        for m in sorted(comp):
            for t in sorted(edges[m] & members):
                print(f"    {name(m)} -> {name(t)}")
    sys.exit(1)
print(f"no import loop among {len(modules)} modules of {src}")
