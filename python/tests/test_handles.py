"""One handle lifecycle: every class that owns a library handle derives from
``_lib.OwnedHandle`` (free exactly once by ``close()``, a ``with`` block or garbage
collection), and no module calls a ``mws_*_free`` function by itself. Runs without
Mooncake."""

from __future__ import annotations

import ast
import gc
import inspect
import weakref
from pathlib import Path

import pytest

import mooncake_weight_store as mws
from mooncake_weight_store import _abi, _lib
from mooncake_weight_store.testing import Model, ModelSpec

PACKAGE = Path(mws.__file__).resolve().parent


def _owned_handle_classes():
    seen, todo = set(), [_lib.OwnedHandle]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen and sub.__module__.startswith("mooncake_weight_store"):
                seen.add(sub)
                todo.append(sub)
    return seen


def test_every_free_function_has_one_owned_handle_class():
    frees = sorted(n for n in _abi.PROTOTYPES if n.endswith("_free"))
    assert len(frees) >= 15
    by_free = {}
    for cls in _owned_handle_classes():
        if "_FREE" in vars(cls):
            by_free.setdefault(cls._FREE, []).append(cls.__qualname__)
    problems = [f"{name}: no OwnedHandle subclass frees it" for name in frees if name not in by_free]
    problems += [f"{name}: freed by {', '.join(sorted(v))}" for name, v in by_free.items() if len(v) > 1]
    assert not problems, "\n".join(problems)


def test_no_module_frees_a_handle_or_writes_a_lifecycle_by_hand():
    """A string "mws_..._free" only in a ``_FREE`` attribute or a prototype, and no
    ``__del__`` in a class that owns a handle outside ``_lib.py``."""
    problems = []
    owned = {c.__qualname__ for c in _owned_handle_classes()}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("mws_")
                    and a.value.endswith("_free") for a in node.args):
                problems.append(f"{path.name}:{node.lineno}: calls {ast.unparse(node)}")
            if isinstance(node, ast.ClassDef) and node.name in owned and path.name != "_lib.py":
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in ("__del__", "__exit__"):
                        problems.append(f"{path.name}:{item.lineno}: {node.name}.{item.name} (use the hooks)")
    assert not problems, "\n".join(problems)


def test_store_writer_loader_lease_binding_and_plans_are_owned_handles():
    for cls in (mws.Store, mws.Writer, mws.Binding, mws.LoadPlan, mws.RegistrationLease, mws.Transaction,
                mws.TransferEngine, mws.TransferPlan, mws.Loader, mws.Sink, mws.StoredManifest, mws.Receipts,
                mws.UploadPlan, mws.Placement, mws.PlacementBuilder):
        assert issubclass(cls, _lib.OwnedHandle), cls
        assert inspect.getattr_static(cls, "__del__") is _lib.OwnedHandle.__dict__["__del__"], cls


def test_free_once_keep_alive_until_free_and_messages():
    m = Model(ModelSpec(hidden=16, layers=1, experts=2))
    pid = m.participant_ids[0]
    bufs = m.source_buffers(pid)
    binding = m.bind(pid, bufs)
    ref = weakref.ref(binding)
    with mws.Store.memory() as store, store.begin_snapshot(m.placement, [m.bind(p, m.source_buffers(p))
                                                                         for p in m.participant_ids]) as w:
        w.write_all()
    manifest = w.manifest
    plan = mws.LoadPlan.new(manifest, m.placement, [binding])
    del binding
    gc.collect()
    assert ref() is not None  # the plan references the binding it recorded
    plan.close()
    plan.close()  # idempotent
    gc.collect()
    assert ref() is None  # released right after the free
    with pytest.raises(ValueError, match="load plan is closed"):
        _ = plan.handle
    with pytest.raises(ValueError, match="writer is freed"):
        _ = w.handle
    with pytest.raises(ValueError, match="store is closed"):
        _ = store.handle
    manifest.close()


def test_binding_with_block_releases_the_buffer_export():
    m = Model(ModelSpec(hidden=16, layers=1, experts=2))
    pid = m.participant_ids[0]
    (fid, info), *_ = [(f.placement_fragment_id, f) for f in m.placement.participant_fragments(pid)]
    buf = bytearray(info.nbytes)
    with mws.Binding(m.placement, pid) as b:
        b.add(fid, buf)
        with pytest.raises(BufferError):
            buf.append(0)  # exported: cannot resize under the library
    buf.append(0)
    with pytest.raises(ValueError, match="binding is closed"):
        _ = b.handle


def test_transaction_stays_readable_after_its_with_block():
    m = Model(ModelSpec(hidden=16, layers=1, experts=2))
    bindings = [m.bind(p, m.source_buffers(p)) for p in m.participant_ids]
    with mws.Store.memory() as store:
        plan = store.plan_upload(m.placement, bindings)
        with store.transaction(plan) as tx:
            for b in bindings:
                tx.upload(m.placement, b)
        assert tx.state == "committed" and tx.manifest is not None
        tx.close()
        with pytest.raises(ValueError, match="transaction is closed"):
            _ = tx.state


# Concrete backends (and the third-party client they wrap) sit on top of the generic
# bridges: nothing generic imports them, lazily or not (TYPE_CHECKING aside).
CONCRETE = {"mooncake_backend", "te_backend"}


def _runtime_imports(path):
    """Module names (relative to the package, or absolute) every import of ``path``
    can load, inside functions too; ``if TYPE_CHECKING:`` blocks are left out."""
    names = set()

    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", "")) \
                    == "TYPE_CHECKING":
                for c in child.orelse:
                    walk(c)
                continue
            if isinstance(child, ast.Import):
                names.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = ("." * child.level) + (child.module or "")
                names.add(base)
                names.update(f"{base}.{a.name}" if child.module else f"{base}{a.name}" for a in child.names)
            walk(child)

    walk(ast.parse(path.read_text(), str(path)))
    return names


def test_generic_modules_import_no_concrete_backend():
    problems = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem in CONCRETE or path.stem == "__init__":
            continue
        for name in sorted(_runtime_imports(path)):
            parts = name.lstrip(".").split(".")
            if CONCRETE & set(parts) or parts[0] == "mooncake":
                problems.append(f"{path.name} imports {name}")
    assert not problems, "\n".join(problems)
