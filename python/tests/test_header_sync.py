"""The ctypes mirror of the C ABI cannot drift from the C header, nor spread.

It is declared in one module, ``mooncake_weight_store/_abi.py``, and checked here
against the header that cbindgen generates from the Rust source (its own drift is
checked by ``.ci/cpp.sh``):

* every prototype of ``_abi.PROTOTYPES`` is a function of the header, with its
  return type and each argument's type, and every function of the header has one;
* every struct of ``_abi`` is a struct of the header with its fields (names, order,
  types; a callback field with its whole signature), derives from ``CStruct``, and
  every struct of the header is mirrored or listed in ``NOT_MIRRORED``;
* every callback type (``CFUNCTYPE``) of ``_abi`` is checked through a struct field or
  a prototype that uses it;
* every ``MWS_*`` constant of ``_abi`` has the header's value, the Python forms built
  from them (``MemoryKind``, ``logs.INFO``, verdict names, ...) have the header's
  names, and ``errors.Status`` is ``mws_status``;
* no other module of the package declares a ctypes struct, callback type, prototype
  or ``MWS_*`` constant (``FOREIGN`` lists the few that mirror other ABIs: DLPack,
  CPython, CUDA).

Types are compared exactly, with the few deliberate ways a Python declaration may be
looser than the header spelled out in :func:`_matches`: a ``void *`` (``c_void_p``)
stands for a byte pointer, an opaque handle or a struct that is not mirrored, and for
the pointers listed in ``UNTYPED``; a ``char *`` (``c_char_p``) for a byte pointer; an
enum is any 32-bit integer.
"""

from __future__ import annotations

import ast
import ctypes
import enum
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import mooncake_weight_store as mws
from mooncake_weight_store import (_abi, binding, engine_bridge, guard, logs, notify, placement, progress, store,
                                   transaction, transfer)
from mooncake_weight_store.errors import Status

HEADER = Path(os.environ.get("MWS_HEADER", Path(__file__).resolve().parents[2] / "include" / "mooncake_weight_store.h"))
PACKAGE = Path(mws.__file__).resolve().parent

#: Structs of the header that Python does not mirror (the functions that take them
#: are declared with a ``void *`` there, and not wrapped).
NOT_MIRRORED = {
    "mws_transfer_region_info": "mws_transfer_plan_region (inspection of a plan, not wrapped)",
    "mws_transfer_endpoint_info": "inside mws_transfer_region_info",
    "mws_transfer_operation_info": "mws_transfer_plan_operation (not wrapped)",
    "mws_transfer_executor_info": "mws_transfer_plan_executor (not wrapped)",
}

#: Typed pointers of the header that Python declares ``void *`` (it passes an integer
#: address there), by (struct or function, field name or argument index).
UNTYPED = {
    ("mws_live_args", "guard"): "ctypes.addressof(GuardBridge.vtable)",
    ("mws_registration_lease_new", 5): "ctypes.addressof(GuardBridge.vtable)",
}

#: ctypes declarations outside ``_abi.py`` that mirror other ABIs than this library's,
#: by (module, name); and ``_lib.py``'s binding of a function to its prototype.
FOREIGN = {
    ("buffers", "_Py_buffer"): "CPython's Py_buffer",
    ("buffers", "_get.argtypes"): "PyObject_GetBuffer",
    ("buffers", "_get.restype"): "PyObject_GetBuffer",
    ("buffers", "_release.argtypes"): "PyBuffer_Release",
    ("buffers", "_release.restype"): "PyBuffer_Release",
    ("tensors", "_DLDevice"): "dlpack.h",
    ("tensors", "_DLDataType"): "dlpack.h",
    ("tensors", "_DLTensor"): "dlpack.h",
    ("tensors", "_DLManagedTensor"): "dlpack.h",
    ("tensors", "_DLPackVersion"): "dlpack.h",
    ("tensors", "_DLManagedTensorVersioned"): "dlpack.h",
    ("tensors", "_DELETER"): "dlpack.h (DLManagedTensor.deleter)",
    ("tensors", "_DLManagedTensor._fields_"): "dlpack.h (declared after the class: it points to itself)",
    ("tensors", "_api.PyCapsule_IsValid.argtypes"): "CPython capsule API",
    ("tensors", "_api.PyCapsule_IsValid.restype"): "CPython capsule API",
    ("tensors", "_api.PyCapsule_GetPointer.argtypes"): "CPython capsule API",
    ("tensors", "_api.PyCapsule_GetPointer.restype"): "CPython capsule API",
    ("tensors", "_api.PyCapsule_SetName.argtypes"): "CPython capsule API",
    ("tensors", "_api.PyCapsule_SetName.restype"): "CPython capsule API",
    ("device", "rt.cudaGetErrorString.argtypes"): "CUDA runtime",
    ("device", "rt.cudaGetErrorString.restype"): "CUDA runtime",
    ("device", "rt.cudaStreamSynchronize.argtypes"): "CUDA runtime",
    ("device", "rt.cudaStreamSynchronize.restype"): "CUDA runtime",
    ("device", "rt.cudaPointerGetAttributes.argtypes"): "CUDA runtime",
    ("device", "rt.cudaPointerGetAttributes.restype"): "CUDA runtime",
    ("device", "rt.cudaGetDeviceCount.argtypes"): "CUDA runtime",
    ("device", "rt.cudaGetDeviceCount.restype"): "CUDA runtime",
    ("device", "f.argtypes"): "CUDA driver (cuInit, cuMemcpyDtoH_v2, ...)",
    ("device", "f.restype"): "CUDA driver",
    # not a declaration: where a function gets its prototype from _abi.PROTOTYPES
    ("_lib", "f.argtypes"): "_Library.fn",
    ("_lib", "f.restype"): "_Library.fn",
}

# --------------------------------------------------------------------------- the header

INTS = {
    "uint64_t": (8, False), "int64_t": (8, True), "uint32_t": (4, False), "int32_t": (4, True),
    "uint16_t": (2, False), "int16_t": (2, True), "size_t": (ctypes.sizeof(ctypes.c_size_t), False),
    "uintptr_t": (ctypes.sizeof(ctypes.c_void_p), False), "int": (ctypes.sizeof(ctypes.c_int), True),
}
BYTES = ("char", "uint8_t", "int8_t")

Desc = Tuple[Any, ...]


class Header:
    """The parts of the header the mirror is checked against, each C type as a
    descriptor: ``("void",)``, ``("int", size, signed)``, ``("byte",)``, ``("enum",
    name)``, ``("struct", name)`` (by value), ``("opaque", name)``, ``("ptr", desc)``,
    ``("fn", ret, [args])``."""

    def __init__(self, path: Path) -> None:
        assert path.is_file(), f"C header not found at {path} (set MWS_HEADER)"
        text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        self.enums: Dict[str, Dict[str, int]] = {
            m.group(1): {n: int(v) for n, v in re.findall(r"(MWS_\w+) = (-?\d+)", m.group(2))}
            for m in re.finditer(r"typedef enum (mws_\w+) \{(.*?)\} \1;", text, flags=re.S)}
        self.defines: Dict[str, int] = {}
        for name, value in re.findall(r"#define (MWS_\w+) (\S+)", text):
            self.defines[name] = 2**64 - 1 if value == "UINT64_MAX" else int(value)
        self.opaque = set(re.findall(r"typedef struct (mws_\w+) \1;", text))
        bodies = {m.group(1): m.group(2)
                  for m in re.finditer(r"typedef struct (mws_\w+) \{(.*?)\} \1;", text, flags=re.S)}
        self.struct_names = set(bodies)
        self.fn_types: Dict[str, Desc] = {}
        for m in re.finditer(r"typedef ([\w \*]+?)\s*\(\*(mws_\w+)\)\((.*?)\);", text, flags=re.S):
            self.fn_types[m.group(2)] = self._fn(m.group(1), m.group(3))
        self.structs: Dict[str, List[Tuple[str, Desc]]] = {
            name: [self._decl(d) for d in _split(body, ";")] for name, body in bodies.items()}
        self.functions: Dict[str, Tuple[Desc, List[Desc]]] = {}
        for m in re.finditer(r"^([A-Za-z_][\w \*]*?[\s\*])(mws_\w+)\((.*?)\);", text, flags=re.M | re.S):
            ret, args = self.type(m.group(1)), _split(m.group(3), ",")
            self.functions[m.group(2)] = (ret, [] if args in ([], ["void"]) else [self._decl(a)[1] for a in args])

    def _fn(self, ret: str, args: str) -> Desc:
        params = _split(args, ",")
        return ("fn", self.type(ret), [] if params in ([], ["void"]) else [self._decl(a)[1] for a in params])

    def _decl(self, decl: str) -> Tuple[str, Desc]:
        """``(name, type)`` of a declaration (a field, a named parameter)."""
        decl = " ".join(decl.split())
        fp = re.fullmatch(r"(.+?)\s*\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)", decl)
        if fp:
            return fp.group(2), ("ptr", self._fn(fp.group(1), fp.group(3)))
        m = re.fullmatch(r"(.*?[\s\*])(\w+)", decl)
        assert m and m.group(1).strip() not in ("", "struct", "enum", "const"), f"unnamed declaration {decl!r}"
        return m.group(2), self.type(m.group(1))

    def type(self, ctype: str) -> Desc:
        t = " ".join(ctype.replace("const", " ").replace("*", " * ").split())
        stars = t.count("*")
        base = t.replace("*", "").strip()
        if base.startswith("struct "):
            name = base[len("struct "):]
            d: Desc = ("struct", name) if name in self.struct_names else ("opaque", name)
        elif base.startswith("enum "):
            d = ("enum", base[len("enum "):])
        elif base in self.fn_types:
            d = ("ptr", self.fn_types[base])  # a function pointer typedef is a pointer
        elif base in self.enums:
            d = ("enum", base)
        elif base in self.struct_names:
            d = ("struct", base)
        elif base in self.opaque:
            d = ("opaque", base)
        elif base == "void":
            d = ("void",)
        elif base in BYTES:
            d = ("byte",)
        elif base in INTS:
            d = ("int",) + INTS[base]
        else:
            raise AssertionError(f"unknown C type in header: {ctype!r}")
        for _ in range(stars):
            d = ("ptr", d)
        return d


def _split(text: str, sep: str) -> List[str]:
    """``text`` split at ``sep`` outside parentheses, pieces stripped, empty ones left out."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [p.strip() for p in out if p.strip()]


_HEADER: Optional[Header] = None


def header() -> Header:
    global _HEADER
    if _HEADER is None:
        _HEADER = Header(HEADER)
    return _HEADER


# --------------------------------------------------------------------------- the mirror


def _py(t: Any) -> Desc:
    """The descriptor of a ctypes type: as :class:`Header`'s, plus ``("void_p",)``
    (``c_void_p``) and ``("char_p",)`` (``c_char_p``)."""
    if t is None:
        return ("void",)
    if t is ctypes.c_void_p:
        return ("void_p",)
    if t is ctypes.c_char_p:
        return ("char_p",)
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return ("ptr", _py(t._type_))
    if isinstance(t, type) and issubclass(t, ctypes._CFuncPtr):
        return ("ptr", ("fn", _py(t._restype_), [_py(a) for a in t._argtypes_]))
    if isinstance(t, type) and issubclass(t, ctypes.Structure):
        return ("struct", t.__name__)
    if isinstance(t, type) and issubclass(t, ctypes._SimpleCData) and t._type_ in "bBhHiIlLqQ":
        return ("int", ctypes.sizeof(t), t(-1).value < 0)
    raise AssertionError(f"unknown ctypes type {t!r}")


def _matches(py: Desc, c: Desc, untyped: bool = False) -> bool:
    """Whether a Python declaration ``py`` stands for the C type ``c`` (``untyped``:
    this pointer is listed in ``UNTYPED``)."""
    if py[0] == "void_p":
        return c[0] == "ptr" and (
            untyped
            or c[1][0] in ("void", "byte", "opaque")
            or c[1][0] == "struct" and c[1][1] in NOT_MIRRORED)
    if py[0] == "char_p":
        return c == ("ptr", ("byte",))
    if c[0] == "enum":
        return py[0] == "int" and py[1] == 4
    if py[0] != c[0]:
        return False
    if c[0] == "ptr":
        return _matches(py[1], c[1])
    if c[0] == "fn":
        return (_matches(py[1], c[1]) and len(py[2]) == len(c[2])
                and all(_matches(p, q) for p, q in zip(py[2], c[2])))
    return py == c


def _show(d: Desc) -> str:
    """A descriptor in C-like words (``uint64 *``, ``int32 (*)(void *, uint64)``)."""
    if d[0] == "ptr" and d[1][0] == "fn":
        return f"{_show(d[1][1])} (*)({', '.join(_show(a) for a in d[1][2])})"
    if d[0] == "ptr":
        return _show(d[1]) + " *"
    if d[0] == "int":
        return f"{'' if d[2] else 'u'}int{8 * d[1]}"
    return {"void_p": "void * (c_void_p)", "char_p": "char * (c_char_p)"}.get(d[0], " ".join(str(x) for x in d))


def _mirrored_structs() -> Dict[str, type]:
    return {k: v for k, v in vars(_abi).items() if isinstance(v, type) and issubclass(v, ctypes.Structure)
            and v.__module__ == _abi.__name__ and v is not _abi.CStruct}


def _callback_types() -> Dict[str, type]:
    return {k: v for k, v in vars(_abi).items() if isinstance(v, type) and issubclass(v, ctypes._CFuncPtr)}


# --------------------------------------------------------------------------- tests


def test_every_prototype_matches_the_header():
    h = header()
    assert len(h.functions) > 150, "header parse found too few functions"
    problems = []
    for name, (ret, args) in _abi.PROTOTYPES.items():
        if name not in h.functions:
            problems.append(f"{name}: declared in _abi.py but not in the header")
            continue
        hret, hargs = h.functions[name]
        if len(hargs) != len(args):
            problems.append(f"{name}: {len(args)} arguments in _abi.py, {len(hargs)} in the header")
            continue
        if not _matches(_py(ret), hret):
            problems.append(f"{name}: returns {_show(_py(ret))} in _abi.py, {_show(hret)} in the header")
        for i, (a, c) in enumerate(zip(args, hargs)):
            if not _matches(_py(a), c, (name, i) in UNTYPED):
                problems.append(f"{name}: argument {i} is {_show(_py(a))} in _abi.py, {_show(c)} in the header")
    missing = sorted(set(h.functions) - set(_abi.PROTOTYPES))
    if missing:
        problems.append(f"functions of the header not declared in _abi.py: {', '.join(missing)}")
    assert not problems, "\n".join(problems)


def test_every_struct_matches_the_header():
    h = header()
    mirrored = _mirrored_structs()
    assert len(mirrored) >= 37
    problems = []
    for name, cls in mirrored.items():
        if name not in h.structs:
            problems.append(f"{name}: not a struct of the header")
            continue
        if not issubclass(cls, _abi.CStruct):
            problems.append(f"{name}: does not derive from CStruct (its integer fields would wrap)")
        fields = [(f[0], f[1]) for f in cls._fields_]
        if [f[0] for f in fields] != [f[0] for f in h.structs[name]]:
            problems.append(f"{name}: fields {[f[0] for f in fields]}, the header's {[f[0] for f in h.structs[name]]}")
            continue
        for (fname, t), (_, c) in zip(fields, h.structs[name]):
            if not _matches(_py(t), c, (name, fname) in UNTYPED):
                problems.append(f"{name}.{fname}: {_show(_py(t))} in _abi.py, {_show(c)} in the header")
    for name in sorted(set(h.structs) - set(mirrored) - set(NOT_MIRRORED)):
        problems.append(f"{name}: a struct of the header that _abi.py does not mirror (mirror it or list it "
                        "in NOT_MIRRORED)")
    for name in sorted(set(NOT_MIRRORED) - (set(h.structs) - set(mirrored))):
        problems.append(f"NOT_MIRRORED lists {name}, which is mirrored or not in the header")
    assert not problems, "\n".join(problems)


def test_untyped_pointers_are_the_listed_ones():
    """Each ``UNTYPED`` entry still names a ``void *`` standing for a typed pointer of
    the header (a stale entry would hide nothing, but would mislead)."""
    h = header()
    mirrored = _mirrored_structs()
    for (owner, which), why in UNTYPED.items():
        if owner in _abi.PROTOTYPES:
            py, c = _abi.PROTOTYPES[owner][1][which], h.functions[owner][1][which]
        else:
            py, c = dict((f[0], f[1]) for f in mirrored[owner]._fields_)[which], dict(h.structs[owner])[which]
        assert py is ctypes.c_void_p and not _matches(_py(py), c), f"UNTYPED {owner} {which} ({why})"


def test_every_callback_type_is_checked():
    """Every ``CFUNCTYPE`` of ``_abi`` is the type of a struct field or of a prototype's
    argument (so the tests above compared its signature with the header's)."""
    used = set()

    def visit(t: Any) -> None:
        if isinstance(t, type) and issubclass(t, ctypes._CFuncPtr) and t not in used:
            used.add(t)
            visit(t._restype_)
            for a in t._argtypes_:
                visit(a)
        elif isinstance(t, type) and issubclass(t, ctypes._Pointer):
            visit(t._type_)

    for cls in _mirrored_structs().values():
        for f in cls._fields_:
            visit(f[1])
    for ret, args in _abi.PROTOTYPES.values():
        for t in [ret, *args]:
            visit(t)
    unused = sorted(name for name, t in _callback_types().items() if t not in used)
    assert not unused, f"callback types of _abi.py that no struct or prototype uses: {unused}"


def test_every_constant_matches_the_header():
    h = header()
    values = dict(h.defines)
    for members in h.enums.values():
        values.update(members)
    constants = {k: v for k, v in vars(_abi).items() if k.startswith("MWS_")}
    assert len(constants) >= 60
    problems = [f"{k} = {v} in _abi.py, {values.get(k, 'absent')} in the header"
                for k, v in constants.items() if values.get(k) != v or not isinstance(v, int)]
    assert not problems, "\n".join(problems)


def _lower(members: Dict[str, int], prefix: str) -> Dict[str, int]:
    return {k[len(prefix):].lower(): v for k, v in members.items() if k.startswith(prefix)}


def test_python_forms_of_the_constants_have_the_header_names():
    """The enums and name tables built from the constants: each name is the header's
    (lower case, prefix dropped) with its value."""
    h = header()
    e, d = h.enums, h.defines

    def members(cls: Any) -> Dict[str, int]:
        if isinstance(cls, type) and issubclass(cls, enum.Enum):
            return {m.name.lower(): int(m.value) for m in cls}
        return {k.lower(): v for k, v in vars(cls).items() if k.isupper()}

    def names(table: Dict[int, str]) -> Dict[str, int]:
        return {v: k for k, v in table.items()}

    cases = {
        "MemoryKind": (members(binding.MemoryKind), _lower(e["mws_memory_kind"], "MWS_MEMORY_")),
        "TerminalState": (members(guard.TerminalState), _lower(e["mws_terminal_state"], "MWS_TERMINAL_")),
        "Decision": (members(store.Decision), _lower(e["mws_decision"], "MWS_DECISION_")),
        "LeaseSide": (members(store.LeaseSide), _lower(e["mws_lease_side"], "MWS_LEASE_")),
        "RecordType": (members(store.RecordType), _lower(d, "MWS_RECORD_")),
        "Direction": (members(engine_bridge.Direction), {k: v for k, v in _lower(d, "MWS_TRANSFER_").items()
                                                         if k in ("read", "write")}),
        "logs": ({n.lower(): getattr(logs, n) for n in ("OFF", "ERROR", "WARN", "INFO", "DEBUG", "TRACE")},
                 _lower(d, "MWS_LOG_")),
        "notify.VERDICTS": (names(notify.VERDICTS), {k: v for k, v in _lower(d, "MWS_NOTIFY_").items()
                                                     if k != "max_transfers_per_writer"}),
        "transfer verdicts": (names(transfer._VERDICTS), _lower(e["mws_target_verdict"], "MWS_TARGET_")),
        "guard releases": (names(transfer._GUARD_RELEASES), _lower(e["mws_guard_release"], "MWS_GUARD_")),
        "SOURCE_ROUTINGS": (transfer.SOURCE_ROUTINGS, _lower(e["mws_source_routing"], "MWS_SOURCE_ROUTING_")),
        "sides": ({"source": transfer.SIDE_SOURCE, "target": transfer.SIDE_TARGET},
                  _lower(e["mws_transfer_side"], "MWS_SIDE_")),
        "progress phases": (names(progress._PHASES), _lower(e["mws_progress_phase"], "MWS_PROGRESS_")),
        "transaction states": (names(transaction._STATES), _lower(e["mws_transaction_state"], "MWS_TRANSACTION_")),
        "axis kinds": (placement._AXIS_KIND_CODES, _lower(e["mws_axis_kind"], "MWS_AXIS_")),
    }
    problems = [f"{what}: {py} in Python, {c} in the header" for what, (py, c) in cases.items() if py != c]
    assert not problems, "\n".join(problems)


def test_status_values_match_the_header():
    header_values = header().enums["mws_status"]
    assert header_values == {f"MWS_{s.name}": int(s) for s in Status}


# --------------------------------------------------------------------------- one module

_STRUCT_BASES = {"Structure", "CStruct", "Union", "BigEndianStructure", "LittleEndianStructure"}
_FUNC_TYPES = {"CFUNCTYPE", "PYFUNCTYPE"}


def _declarations(tree: ast.AST) -> List[Tuple[str, str]]:
    """``(what, name)`` of every ctypes declaration in a module's syntax tree."""
    found = []

    def base_name(node: ast.expr) -> str:
        return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (
                any(base_name(b) in _STRUCT_BASES for b in node.bases)
                or any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_fields_"
                                                         for t in n.targets) for n in node.body)):
            found.append(("struct", node.name))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [t for tg in targets for t in (tg.elts if isinstance(tg, ast.Tuple) else [tg])]
            for t in flat:
                if isinstance(t, ast.Attribute) and t.attr in ("argtypes", "restype", "_fields_"):
                    found.append(("prototype" if t.attr != "_fields_" else "struct", ast.unparse(t)))
                elif isinstance(t, ast.Name) and (t.id.startswith("MWS_") or t.id == "PROTOTYPES"):
                    found.append(("constant" if t.id != "PROTOTYPES" else "prototype", t.id))
                elif isinstance(t, ast.Subscript) and "PROTOTYPES" in ast.unparse(t.value):
                    found.append(("prototype", ast.unparse(t)))
            value = node.value
            if isinstance(value, ast.Call) and base_name(value.func) in _FUNC_TYPES:
                found.append(("callback type", ", ".join(ast.unparse(t) for t in flat)))
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and "PROTOTYPES" in ast.unparse(f.value) and f.attr != "get":
                found.append(("prototype", ast.unparse(f)))
            elif base_name(f) == "register_prototypes":
                found.append(("prototype", ast.unparse(f)))
        elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                and k.value.startswith("mws_") for k in node.keys):
            found.append(("prototype", "a dict keyed by mws_* names"))
        elif isinstance(node, ast.FunctionDef) and node.name == "register_prototypes":
            found.append(("prototype", node.name))
    # a callback type made inline (``ctypes.CFUNCTYPE(...)`` not assigned to a name)
    assigned = {id(n.value) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and base_name(node.func) in _FUNC_TYPES and id(node) not in assigned:
            found.append(("callback type", ast.unparse(node)))
    return found


def test_the_abi_is_declared_in_abi_py_only():
    """Structs, callback types, prototypes and ``MWS_*`` constants live in
    ``_abi.py``; anything of the kind elsewhere is one of the ``FOREIGN`` mirrors of
    another ABI."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "_abi.py":
            continue
        for what, name in _declarations(ast.parse(path.read_text(), str(path))):
            found[(path.stem, name)] = what
    stray = sorted(f"{m}.py: {what} {name}" for (m, name), what in found.items() if (m, name) not in FOREIGN)
    assert not stray, "declared outside _abi.py (move it there, or list a foreign ABI in FOREIGN):\n" + "\n".join(stray)
    stale = sorted(f"{m}.py: {name}" for m, name in FOREIGN if (m, name) not in found)
    assert not stale, "FOREIGN lists what is no longer declared: " + ", ".join(stale)
    assert not [k for k in FOREIGN if re.search(r"\b(mws|MWS)_", k[1])], "a foreign declaration names this ABI"


def test_abi_py_declares_what_it_is_checked_for():
    """The scan above finds the declarations of ``_abi.py`` itself (so it would find
    them elsewhere): its structs, callback types, constants and prototypes."""
    found = _declarations(ast.parse((PACKAGE / "_abi.py").read_text()))
    structs = {name for what, name in found if what == "struct"}
    assert set(_mirrored_structs()) <= structs
    callbacks = {n for what, names in found if what == "callback type" for n in names.split(", ")}
    assert set(_callback_types()) <= callbacks
    assert {k for k in vars(_abi) if k.startswith("MWS_")} <= {name for what, name in found if what == "constant"}
    assert ("prototype", "PROTOTYPES") in found and ("prototype", "a dict keyed by mws_* names") in found


def test_no_module_keeps_a_struct_of_the_abi():
    """Other modules use the struct classes of ``_abi`` (imported, or by
    ``_abi.name``); none holds a class of its own under a header struct's name."""
    h = header()
    for path in sorted(PACKAGE.glob("*.py")):
        mod = getattr(mws, path.stem, None) if path.stem != "__init__" else mws
        for name, v in vars(mod or object).items():
            if isinstance(v, type) and issubclass(v, ctypes.Structure) and v.__name__ in h.structs:
                assert v.__module__ == _abi.__name__, f"{path.name}: {name} is {v.__module__}.{v.__name__}"
