"""The ctypes declarations cannot drift from the C header: every prototype in
``_abi.PROTOTYPES`` has the header's arity and argument/return kinds, every function
of the header is declared, every mirrored struct has the header's fields in order, and
``errors.Status`` has the header's ``mws_status`` values. The header is the one that
cbindgen generates from the Rust source (its drift is checked by ``.ci/cpp.sh``)."""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

import mooncake_weight_store  # noqa: F401  (imports every module: all prototypes registered)
from mooncake_weight_store import _abi
from mooncake_weight_store.errors import Status

HEADER = Path(os.environ.get("MWS_HEADER", Path(__file__).resolve().parents[2] / "include" / "mooncake_weight_store.h"))

INTS = {
    "uint64_t": ctypes.c_uint64, "int64_t": ctypes.c_int64, "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32, "size_t": ctypes.c_size_t, "int": ctypes.c_int, "uintptr_t": ctypes.c_size_t,
}


def _header() -> str:
    assert HEADER.is_file(), f"C header not found at {HEADER} (set MWS_HEADER)"
    text = HEADER.read_text()
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _enums(text: str) -> set:
    return set(re.findall(r"enum (\w+) \{", text)) | set(re.findall(r"typedef enum (\w+)", text))


def _kind(ctype: str, enums: set) -> str:
    """'void', 'ptr', or the integer's size in bytes, of a C type."""
    t = " ".join(ctype.replace("const ", "").split())
    if "*" in t or "(" in t:
        return "ptr"
    if t == "void":
        return "void"
    if t in INTS:
        return str(ctypes.sizeof(INTS[t]))
    if t in enums or t.startswith("enum ") or t == "mws_status":
        return str(ctypes.sizeof(ctypes.c_int))
    if t.startswith("mws_") and t.endswith("_fn"):
        return "ptr"
    raise AssertionError(f"unknown C type in header: {ctype!r}")


def _py_kind(t) -> str:
    if t is None:
        return "void"
    if t in (ctypes.c_void_p, ctypes.c_char_p) or isinstance(t, type) and issubclass(t, (ctypes._Pointer, ctypes._CFuncPtr)):
        return "ptr"
    if isinstance(t, type) and issubclass(t, ctypes._SimpleCData):
        return str(ctypes.sizeof(t))
    raise AssertionError(f"unknown ctypes type {t!r}")


def _functions(text: str):
    out = {}
    for m in re.finditer(r"^([A-Za-z_][\w \*]*?[\s\*])(mws_\w+)\(([^;{]*?)\);", text, flags=re.M | re.S):
        ret, name, args = m.group(1).strip(), m.group(2), " ".join(m.group(3).split())
        params = [] if args in ("", "void") else [a.strip() for a in re.split(r",(?![^()]*\))", args)]
        out[name] = (ret, [re.sub(r"\b\w+$", "", p).strip() if not p.endswith("*") else p for p in params])
    return out


def _structs(text: str):
    out = {}
    for m in re.finditer(r"typedef struct (mws_\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for decl in [d.strip() for d in m.group(2).split(";") if d.strip()]:
            fp = re.search(r"\(\s*\*\s*(\w+)\s*\)", decl)
            fields.append(fp.group(1) if fp else re.findall(r"(\w+)\s*(?:\[\w*\])?$", decl)[0])
        out[m.group(1)] = fields
    return out


def test_every_prototype_matches_the_header():
    text = _header()
    enums = _enums(text)
    header = _functions(text)
    assert len(header) > 50, "header parse found too few functions"
    problems = []
    for name, (ret, args) in _abi.PROTOTYPES.items():
        if name not in header:
            problems.append(f"{name}: declared in _lib.py but not in the header")
            continue
        hret, hargs = header[name]
        if len(hargs) != len(args):
            problems.append(f"{name}: {len(args)} arguments in _lib.py, {len(hargs)} in the header")
            continue
        if _py_kind(ret) != _kind(hret, enums):
            problems.append(f"{name}: return {ret!r} vs header {hret!r}")
        for i, (a, h) in enumerate(zip(args, hargs)):
            if _py_kind(a) != _kind(h, enums):
                problems.append(f"{name}: argument {i} {a!r} vs header {h!r}")
    missing = sorted(set(header) - set(_abi.PROTOTYPES))
    if missing:
        problems.append(f"functions of the header not declared in _lib.py: {', '.join(missing)}")
    assert not problems, "\n".join(problems)


def test_mirrored_structs_match_the_header():
    structs = _structs(_header())
    mirrored = [v for v in vars(_abi).values() if isinstance(v, type) and issubclass(v, ctypes.Structure)
                and v.__name__.startswith("mws_")]
    assert len(mirrored) >= 10
    for cls in mirrored:
        assert cls.__name__ in structs, f"{cls.__name__} is not a struct of the header"
        assert [f[0] for f in cls._fields_] == structs[cls.__name__], cls.__name__


def test_status_values_match_the_header():
    text = _header()
    body = re.search(r"enum mws_status \{(.*?)\}", text, flags=re.S)
    assert body, "mws_status not found in the header"
    header = {n: int(v) for n, v in re.findall(r"(MWS_\w+) = (\d+)", body.group(1))}
    assert header == {f"MWS_{s.name}": int(s) for s in Status}
