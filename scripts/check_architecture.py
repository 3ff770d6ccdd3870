#!/usr/bin/env python3
"""Fails when the layer table of docs/ARCHITECTURE.md and the imports of the core
crate (src/) disagree. Prints every disagreement and exits 1 if any.

Usage: python3 scripts/check_architecture.py [--list] [ARCHITECTURE.md [SRC]]
(default: docs/ARCHITECTURE.md and src/ of this repository; --list also prints
the layers each layer uses in the code, with one path for each arrow)

The declared arrows: every Markdown table of the document whose header is
`| layer | folder | holds | may use |`. A row is a layer of the core when every
path of its `folder` column (the backticked paths) is under `src/`; other rows
(`adapters/...`) are outside the crate and left alone. The `may use` column is a
comma-separated list of layer names, or `nothing of ours`, or `all of the above`
(every layer of the rows above it, in the same table).

The real arrows: every `.rs` file under SRC except `lib.rs` (the crate's front
door: module declarations and re-exports) and `bin/` (the CLI, a user of the
library) belongs to the layer whose folder holds it, the most specific one
(`src/model/` holds every file under it, `src/geometry.rs` only itself); every
such file must be some layer's. An arrow `X -> Y` is a `crate::`,
`super::` or `self::` path in a file of layer X that names a module of layer Y
(the longest prefix of the path that is a module, as in
scripts/check_module_cycles.py; a name the crate root re-exports, such as
`crate::Error`, is an arrow to the module it comes from). Comments, string
literals and test code are not arrows: items under `#[cfg(test)]` (or
`#[cfg(all(test, ...))]`) are left out, and so are the modules they declare
(`testutil`).

Reported:
  - a file of src/ that no layer's folder holds;
  - a name in a `may use` column that is no layer;
  - "layer X uses Y but ARCHITECTURE.md does not declare it";
  - "ARCHITECTURE.md declares X may use Y but the code does not".
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_module_cycles import resolve_path  # noqa: E402  (the same path resolution)

ROOT = Path(__file__).resolve().parent.parent
HEADER = ["layer", "folder", "holds", "may use"]

# --------------------------------------------------------------------------- the document


def cells(line):
    """The cells of a Markdown table row (no leading/trailing pipe), or None."""
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        return None
    return [c.strip() for c in line[1:-1].split("|")]


def declared_layers(doc):
    """[(name, folders, may_use_text, line number)] of every layer row, in order,
    grouped per table: a list of tables, each a list of rows."""
    tables, current, in_table = [], None, False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        row = cells(line)
        if row is None:
            in_table, current = False, None
            continue
        if not in_table:
            in_table = True
            if [c.lower() for c in row] == HEADER:
                current = []
                tables.append(current)
            continue
        if current is None or set(line.strip()) <= set("|-: "):
            continue
        if len(row) != len(HEADER):
            sys.exit(f"{doc}:{n}: a layer row needs {len(HEADER)} cells, found {len(row)}")
        folders = re.findall(r"`([^`]+)`", row[1])
        current.append((row[0], folders, row[3], n))
    return tables


def may_use(text, above, known):
    """The set of layer names a `may use` cell declares, and the unknown names."""
    t = text.strip().rstrip(".").lower()
    if t == "nothing of ours":
        return set(), []
    if t == "all of the above":
        return set(above), []
    names = [x.strip() for x in re.split(r",|\band\b", text) if x.strip()]
    names = [x.strip("`") for x in names]
    return {x for x in names if x in known}, [x for x in names if x not in known]


# --------------------------------------------------------------------------- the code

TEST_CFG = re.compile(r"#\[cfg\((test|all\((?:[^()]|\([^()]*\))*\))\)\]")


def is_test_cfg(pred):
    if pred == "test":
        return True
    # all(a, b, ...): test is required when it is one of the top-level arguments.
    inner = pred[len("all("):-1]
    depth, parts, cur = 0, [], ""
    for ch in inner:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return "test" in parts


def blank(text):
    """The text with comments removed and string / char literals emptied (their
    quotes kept), so that neither braces nor paths inside them count."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
            continue
        m = re.compile(r'b?r(#*)"').match(text, i)
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
            i = end
            continue
        if c == '"' or (c == "b" and text.startswith('b"', i) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_"))):
            i += 1 if c == '"' else 2
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            out.append('""')
            i += 1
            continue
        if c == "'":
            # A char literal ('x', '\n', '\u{..}', '{') or a lifetime / label ('a).
            m = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^'\\])'").match(text, i)
            if m:
                out.append("' '")
                i = m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def item_end(text, i):
    """The end of the item (or statement) that starts at i: after its first `;` at
    depth 0, or after the `}` that closes its first top-level block."""
    depth, opened = 0, False
    while i < len(text):
        c = text[i]
        if c in "([{":
            if c == "{" and depth == 0:
                opened = True
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == "}" and opened:
                return i + 1
            if depth < 0:  # the enclosing block ends: the item ended before
                return i
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    return i


def strip_test_code(text):
    """(text without the items under a test-only cfg, names of the `mod x;` left out)."""
    test_mods = []
    while True:
        m = next((m for m in TEST_CFG.finditer(text) if is_test_cfg(m.group(1))), None)
        if m is None:
            return text, test_mods
        end = item_end(text, m.end())
        decl = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", text[m.end():end])
        if decl:
            test_mods.append(decl.group(1))
        text = text[: m.start()] + " " + text[end:]


PATH = re.compile(r"(?<![A-Za-z0-9_$])\$?((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"(?<![A-Za-z0-9_])\$?((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")


def group_paths(text):
    """`prefix::{a, b::c, d::{e, f}}` as the paths prefix::a, prefix::b::c, prefix::d::e, ..."""
    out = []
    for m in GROUP.finditer(text):
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out += expand(m.group(1), text[m.end(): j - 1])
    return out


def expand(prefix, inner):
    out, depth, cur = [prefix], 0, ""
    items = []
    for ch in inner:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    for item in items:
        item = item.strip()
        if not item or item in ("self", "*"):
            continue
        m = re.match(r"([A-Za-z_][A-Za-z0-9_:]*?)::\{(.*)\}$", item, re.S)
        if m:
            out += expand(f"{prefix}::{m.group(1)}", m.group(2))
        else:
            out.append(f"{prefix}::{item.split(' as ')[0].strip()}")
    return out


def root_reexports(lib_text, modules):
    """Names the crate root re-exports (`pub use a::b::Name;`, `pub use a::{B, C as D}`)
    -> the module they come from, and the modules of its glob re-exports
    (`pub use model::*;`)."""
    names, globs = {}, []
    for m in re.finditer(r"\bpub\s+use\s+([^;]+);", lib_text):
        body = re.sub(r"\s+", " ", m.group(1)).strip()
        # Keep the aliases: `x as y` becomes one item `x@y` before the expansion.
        body = re.sub(r"\s+as\s+", "@", body).replace(" ", "")
        for path in expand("crate", body)[1:]:
            path, _, alias = path.partition("@")
            segs = path.split("::")[1:]
            module = next((tuple(segs[:k]) for k in range(len(segs), 0, -1) if tuple(segs[:k]) in modules), None)
            if module is None:
                continue
            if segs[-1] == "*":
                globs.append(module)
            else:
                names[alias or segs[-1]] = module
    return names, globs


def module_files(src):
    """module path (tuple) -> file, for every .rs file of the crate but bin/."""
    modules = {}
    for f in sorted(src.rglob("*.rs")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[0] == "bin":
            continue
        if parts[-1] in ("mod", "lib"):
            parts = parts[:-1]
        modules[tuple(parts)] = f
    return modules


def real_arrows(src):
    """(modules, texts, arrows): arrows[(from module, to module)] = first path seen."""
    modules = module_files(src)
    texts, test_only = {}, set()
    for mod, f in modules.items():
        text, test_mods = strip_test_code(blank(f.read_text()))
        texts[mod] = text
        # `mod x;` in a/b.rs or a/b/mod.rs declares a::b::x (lib.rs: x).
        test_only |= {mod + (t,) for t in test_mods}
    for mod in list(modules):
        if any(mod[: len(t)] == t for t in test_only):
            del modules[mod]
            del texts[mod]
    test_names = {t[0] for t in test_only if len(t) == 1}
    names, globs = root_reexports(texts[()], modules)

    def resolve(mod, path):
        found, base, segs = resolve_path(modules, mod, path)
        if found is not None:
            return found
        # The crate root: a re-exported name, or a name of a glob re-export.
        if not base and segs and segs[0] not in test_names:
            if segs[0] in names:
                return names[segs[0]]
            if segs[0][:1].isalpha() and globs:
                return globs[0]
        return None

    arrows = {}
    for mod, text in texts.items():
        if mod == ():
            continue
        for p in group_paths(text) + PATH.findall(text):
            target = resolve(mod, p)
            if target is not None and target != mod:
                arrows.setdefault((mod, target), p)
    return modules, arrows


# --------------------------------------------------------------------------- the check


def main():
    args = sys.argv[1:]
    listing = "--list" in args
    args = [a for a in args if a != "--list"]
    doc = Path(args[0]) if args else ROOT / "docs/ARCHITECTURE.md"
    src = Path(args[1]) if len(args) > 1 else ROOT / "src"
    problems = []
    tables = declared_layers(doc)
    layers = {}  # name -> (folders, declared set, line)
    order = []
    for table in tables:
        above = []
        rows = []
        for name, folders, text, line in table:
            if not folders or not all(f.startswith("src/") for f in folders):
                continue
            rows.append((name, folders, text, line))
        known = {r[0] for t in tables for r in t}
        for name, folders, text, line in rows:
            uses, unknown = may_use(text, above, known)
            for u in unknown:
                problems.append(f"{doc.name}:{line}: layer {name}: '{u}' in its 'may use' column is no layer")
            if name in layers:
                problems.append(f"{doc.name}:{line}: layer {name} has two rows")
            layers[name] = (folders, uses, line)
            order.append(name)
            above.append(name)
    if not layers:
        print(f"no layer table (| layer | folder | holds | may use |) with src/ folders in {doc}")
        sys.exit(1)

    modules, arrows = real_arrows(src)

    def layer_of(mod):
        rel = "src/" + modules[mod].relative_to(src).as_posix()
        # The most specific folder that holds the file (`src/a/b/` before `src/a/`).
        hits = [(len(f), name) for name in order for f in layers[name][0]
                if (f.endswith("/") and rel.startswith(f)) or rel == f]
        return max(hits)[1] if hits else None

    layer = {}
    for mod in modules:
        if mod == ():
            continue
        layer[mod] = layer_of(mod)
        if layer[mod] is None:
            problems.append(f"src/{modules[mod].relative_to(src).as_posix()} is in no layer's folder of {doc.name}")

    real = {}  # (X, Y) -> example
    for (a, b), path in sorted(arrows.items()):
        la, lb = layer.get(a), layer.get(b)
        if la and lb and la != lb:
            real.setdefault((la, lb), f"src/{modules[a].relative_to(src).as_posix()}: {path}")
    if listing:
        for x in order:
            uses = sorted(y for (a, y) in real if a == x)
            print(f"{x} uses: {', '.join(uses) or 'nothing of ours'}")
            for y in uses:
                print(f"    {y}  ({real[(x, y)]})")
    declared = {(x, y) for x in order for y in layers[x][1] if y != x}
    for (x, y), where in sorted(real.items()):
        if (x, y) not in declared:
            problems.append(f"layer {x} uses {y} but {doc.name} does not declare it ({where})")
    for x, y in sorted(declared - set(real)):
        problems.append(f"{doc.name} declares {x} may use {y} but the code does not")

    if problems:
        print(f"{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    files = sum(1 for m in modules if m != ())
    try:
        where = src.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        where = src
    print(f"{doc.name} agrees with the code: {len(order)} layers, {len(real)} arrows between them, {files} files of {where}/")


if __name__ == "__main__":
    main()
