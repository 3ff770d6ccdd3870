"""Loading ``libmooncake_weight_store.so``, calling it, and owning its handles.

The C ABI itself (structs, callback types, constants, function prototypes) is declared
in :mod:`._abi`; :meth:`_Library.fn` binds a function with its prototype from there.

Library lookup order (first hit wins):

1. ``MWS_LIBRARY``: path to the shared library file, or to a directory containing it.
1b. The library packaged inside this package by the wheel build
   (``mooncake_weight_store/libmooncake_weight_store*.so``).
2. ``MWS_PREFIX`` (or ``CMAKE_INSTALL_PREFIX``): a CMake install prefix; the library is
   looked for in ``<prefix>/lib``, ``<prefix>/lib64`` and ``<prefix>/lib/<multiarch>``.
3. A repository build: ``target/release`` (then ``target/debug``) of a checkout found
   by walking up from this file and from the current directory.
4. The system loader (``libmooncake_weight_store.so.0``, ``LD_LIBRARY_PATH``,
   ``ldconfig``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import inspect
import os
import threading
from ctypes import c_size_t, c_uint64, c_void_p
from pathlib import Path
from types import TracebackType
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Type, TypeVar

from ._abi import PROTOTYPES, check_int, int_range
from .errors import ArgumentError, LibraryNotFoundError, MissingSymbolError, MwsError, Status, error_for_status

LIB_NAME = "libmooncake_weight_store.so"
SONAME = "libmooncake_weight_store.so.0"

# --------------------------------------------------------------------------- calls


def _checked(name: str, f: Any) -> Any:
    """``f`` with its integer arguments range-checked against its argtypes, and its
    handle arguments held in use for the call: an :class:`OwnedHandle` (or a
    :func:`handle_array` of them) passed as an argument is replaced by its handle, and
    its :meth:`~OwnedHandle.close` waits until the call has returned."""
    ranges = [(i, t) for i, t in enumerate(f.argtypes or ()) if int_range(t) is not None]

    def call_checked(*args: Any) -> Any:
        for i, t in ranges:
            if i < len(args):
                check_int(args[i], t, f"{name} argument {i + 1}")
        held: List[OwnedHandle] = []
        try:
            if any(isinstance(a, OwnedHandle) or hasattr(a, "_mws_owners") for a in args):
                args = tuple(_enter_arg(a, held) for a in args)
            return f(*args)
        finally:
            for h in reversed(held):
                h._leave()

    call_checked.__name__ = name
    return call_checked


def _enter_arg(a: Any, held: List["OwnedHandle"]) -> Any:
    """The C value of one argument: a handle object's handle (held in use), a handle
    array filled with its objects' handles (each held), anything else as it is."""
    if isinstance(a, OwnedHandle):
        h = a._enter()
        held.append(a)
        return h
    owners = getattr(a, "_mws_owners", None)
    if owners is not None:
        for i, o in enumerate(owners):
            if o is not None:
                a[i] = o._enter()
                held.append(o)
    return a


def handle_array(objects: Sequence[Optional["OwnedHandle"]]) -> Any:
    """A C array (``void **``) of the handles of ``objects`` (``None``: NULL) for one
    library call: passed to a function bound by ``LIB.fn``, each object is held in
    use for the call (its handle is written into the array then)."""
    arr = (c_void_p * max(len(objects), 1))()
    arr._mws_owners = list(objects)
    return arr


# --------------------------------------------------------------------------- loading


def _candidate_paths() -> Iterable[str]:
    env = os.environ.get("MWS_LIBRARY")
    if env:
        p = Path(env)
        if p.is_dir():
            yield str(p / LIB_NAME)
            yield str(p / SONAME)
        else:
            yield str(p)
        return  # an explicit choice is never second-guessed
    yield from packaged_libraries()
    for var in ("MWS_PREFIX", "CMAKE_INSTALL_PREFIX"):
        prefix = os.environ.get(var)
        if prefix:
            for sub in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
                yield str(Path(prefix) / sub / LIB_NAME)
    seen = set()
    for start in (Path(__file__).resolve().parent, Path.cwd().resolve()):
        for d in (start, *start.parents):
            if d in seen:
                continue
            seen.add(d)
            if (d / "Cargo.toml").is_file():
                for profile in ("release", "debug"):
                    yield str(d / "target" / profile / LIB_NAME)
    yield SONAME
    found = ctypes.util.find_library("mooncake_weight_store")
    if found:
        yield found


def packaged_libraries() -> List[str]:
    """The shared library the wheel placed inside this package (setuptools-rust names
    it ``libmooncake_weight_store.abi3.so``), if any."""
    here = Path(__file__).resolve().parent
    return [str(p) for p in sorted(here.glob("libmooncake_weight_store*.so*"))]


class _Library:
    """The loaded library plus lazily bound, typed functions."""

    def __init__(self) -> None:
        self._cdll: Optional[ctypes.CDLL] = None
        self.path: str = ""
        self._funcs: Dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self) -> ctypes.CDLL:
        errors = []
        for cand in _candidate_paths():
            if os.sep in cand and not os.path.exists(cand):
                errors.append(f"{cand}: not found")
                continue
            try:
                cdll = ctypes.CDLL(cand)
            except OSError as e:
                errors.append(f"{cand}: {e}")
                continue
            self.path = cand
            return cdll
        raise LibraryNotFoundError(
            "cannot load libmooncake_weight_store (set MWS_LIBRARY to the .so, or MWS_PREFIX "
            "to a CMake install prefix; build it with `cargo build --release`). Tried: "
            + "; ".join(errors)
        )

    @property
    def cdll(self) -> ctypes.CDLL:
        if self._cdll is None:
            with self._lock:
                if self._cdll is None:
                    self._cdll = self._load()
        return self._cdll

    def has(self, name: str) -> bool:
        try:
            getattr(self.cdll, name)
            return True
        except AttributeError:
            return False

    def fn(self, name: str) -> Any:
        f = self._funcs.get(name)
        if f is not None:
            return f
        try:
            f = getattr(self.cdll, name)
        except AttributeError:
            raise MissingSymbolError(name, self.path) from None
        proto = PROTOTYPES.get(name)
        if proto is None:
            raise MissingSymbolError(name + " (no Python prototype)", self.path)
        f.restype, f.argtypes = proto
        f = _checked(name, f)
        self._funcs[name] = f
        return f

    def exported(self) -> List[str]:
        """Names of the prototyped functions the loaded library exports."""
        return sorted(n for n in PROTOTYPES if self.has(n))


LIB = _Library()


def last_error() -> str:
    raw = LIB.fn("mws_last_error_message")()
    return raw.decode("utf-8", "replace") if raw else ""


def status_name(status: int) -> str:
    raw = LIB.fn("mws_status_name")(int(status))
    return raw.decode() if raw else "MWS_UNKNOWN_STATUS"


def check(status: int) -> None:
    """Raises the matching :class:`MwsError` for a non-zero status (reads the last
    error on the calling thread, so call it right after the failed function)."""
    if status != Status.OK:
        msg = last_error()
        raise error_for_status(status, msg, status_name(status))


def call(name: str, *args: Any) -> None:
    """Calls a status-returning function and raises on failure."""
    check(LIB.fn(name)(*args))


def borrowed_str(name: str, handle: Any) -> str:
    """Calls a ``const char *f(handle, size_t *len)`` accessor and decodes the result
    (length-aware, so an interior NUL is kept)."""
    with handle._use() if isinstance(handle, OwnedHandle) else contextlib.nullcontext():
        n = c_size_t(0)
        ptr = LIB.fn(name)(handle, ctypes.byref(n))
        if not ptr:
            msg = last_error()
            raise error_for_status(Status.NULL_ARGUMENT, msg or f"{name} returned NULL")
        return ctypes.string_at(ptr, n.value).decode("utf-8")


_Self = TypeVar("_Self", bound="OwnedHandle")


class OwnedHandle:
    """A library handle this object owns: freed exactly once, by :meth:`close`, at
    the end of a ``with`` block, or when the object is collected.

    Every class that owns a library handle derives from this one; the lifecycle is
    written here only. Subclasses name their free function (``_FREE``) and what they
    are (``_WHAT``, for messages), and extend the lifecycle through these hooks
    instead of re-implementing it:

    * ``keep`` (constructor) / :meth:`_keep_alive`: Python objects the C object
      borrows from (bindings whose buffers a plan records, the engine of a loader,
      ...); referenced until the handle is freed, released right after the free;
    * :meth:`_on_exit`: what leaving a ``with`` block does before the free (commit
      or abort a writer, close a lease with a terminal state); ``_FREE_ON_EXIT =
      False`` keeps the handle after the block (a transaction stays readable);
    * :meth:`_after_free`: releases what the object owns beside the handle once the
      library no longer uses it (buffer exports, buried vtable bridges).

    Lifetimes and threads (the rule of every handle):

    * **No free under a running call.** A library call that takes this object (not
      its bare ``handle``) as an argument holds it in use until it returns;
      :meth:`close` from another thread waits for those calls, and a close from
      inside one of them (a callback on the same thread) is done when that call
      returns. No call starts once :meth:`close` was called (``ArgumentError``:
      "<what> is closed").
    * **No free under a borrower.** A handle kept by another (``keep``: the bindings
      of a prepared transfer, a plan's placements, ...) is lent to it: closing it
      refuses further calls at once, but the free (and :meth:`_after_free`, which
      releases buffer exports) waits until every handle that keeps it is freed.

    :meth:`close` is the public way to free (a subclass whose ``close`` means
    something else, e.g. closing a lease, frees with :meth:`_free`);
    ``__del__`` always frees with :meth:`_free` and never raises. A handle
    created in two steps (``__init__`` first, the library call later) starts as
    ``None`` and is set with :meth:`_adopt`.
    """

    _FREE = ""
    _WHAT = "handle"
    #: the word in "<what> is <gone>" once the handle was freed
    _GONE = "closed"
    _FREE_ON_EXIT = True
    #: public methods that run without holding the handle (close itself; calls that
    #: must reach a handle while another call runs, such as cancel)
    _UNHELD: Tuple[str, ...] = ("close",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every public method and property of a subclass holds the handle in use
        while it runs (see the class), so that what it reads from the handle after a
        library call (a report, a lent string) cannot be freed by a concurrent
        :meth:`close`."""
        super().__init_subclass__(**kwargs)
        for name, attr in list(vars(cls).items()):
            if name.startswith("_") or name in cls._UNHELD:
                continue
            if isinstance(attr, property) and attr.fget is not None:
                setattr(cls, name, property(_held(attr.fget), attr.fset, attr.fdel, attr.__doc__))
            elif inspect.isfunction(attr):
                setattr(cls, name, _held(attr))

    def __init__(self, handle: Optional[int] = None, keep: Iterable[object] = ()) -> None:
        self._h: Optional[int] = handle or None
        self._keep: List[object] = []
        self._cv = threading.Condition(threading.Lock())
        self._calls: Dict[int, int] = {}  # thread id -> calls of that thread holding the handle
        self._closing = False  # close() was called: no new call
        self._borrowers = 0  # handles keeping this one (see _keep_alive)
        self._waiting = 0  # closes waiting for the calls to return (they free it)
        self._keep_alive(*keep)

    def _adopt(self, handle: Optional[int]) -> None:
        """Takes ownership of ``handle`` (created after ``__init__``)."""
        self._h = handle or None

    def _keep_alive(self, *objects: object) -> None:
        """References ``objects`` until the handle is freed; a kept handle is lent to
        this one (its free waits for this one's)."""
        for o in objects:
            if isinstance(o, OwnedHandle):
                with o._cv:
                    o._borrowers += 1
        self._keep.extend(objects)

    @property
    def handle(self) -> int:
        """The raw handle (for code that calls the library itself: pass the object to
        a ``LIB.fn`` function instead, which holds it in use for the call)."""
        h = self._h
        if h is None or self._closing:
            raise ArgumentError(f"{self._WHAT} is {self._GONE}")
        return h

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        """Holds the handle in use for a block (its handle; ``ArgumentError`` when
        closed)."""
        h = self._enter()
        try:
            yield h
        finally:
            self._leave()

    def _enter(self) -> int:
        """Holds the handle in use by one call of this thread (see :meth:`_leave`)."""
        with self._cv:
            if self._h is None or self._closing:
                raise ArgumentError(f"{self._WHAT} is {self._GONE}")
            t = threading.get_ident()
            self._calls[t] = self._calls.get(t, 0) + 1
            return self._h

    def _leave(self) -> None:
        """Ends one call's use; the last one does a free that waited for it."""
        with self._cv:
            t = threading.get_ident()
            n = self._calls.get(t, 0) - 1
            if n > 0:
                self._calls[t] = n
            else:
                self._calls.pop(t, None)
            ready = (self._closing and not self._calls and not self._borrowers and not self._waiting
                     and self._h is not None)
            self._cv.notify_all()
        if ready:
            self._release()

    def _returned(self) -> None:
        """A handle that kept this one was freed; the last does a deferred free."""
        with self._cv:
            self._borrowers -= 1
            ready = (self._closing and not self._calls and not self._borrowers and not self._waiting
                     and self._h is not None)
        if ready:
            self._release()

    def _free(self) -> None:
        """Frees the handle once no call and no borrower uses it (once; later calls
        do nothing), then releases the kept objects and runs :meth:`_after_free`.
        Waits for the calls of other threads; from inside a call of this thread, or
        while borrowed, the free happens when the last of them ends."""
        with self._cv:
            if self._h is None:
                return
            self._closing = True
            if threading.get_ident() in self._calls or self._borrowers:
                return  # done by the last _leave / _returned
            self._waiting += 1
            try:
                while self._calls:
                    self._cv.wait()
            finally:
                self._waiting -= 1
            if self._borrowers:
                return  # lent while waiting: done by the last _returned
        self._release()

    def _release(self) -> None:
        """The free itself: at most once, with no call and no borrower left."""
        with self._cv:
            h, self._h = self._h, None
        if not h:
            return
        keep, self._keep = self._keep, []
        try:
            LIB.fn(self._FREE)(h)
        finally:
            try:
                self._after_free()
            finally:
                for o in keep:
                    if isinstance(o, OwnedHandle):
                        o._returned()

    def _after_free(self) -> None:
        """Hook: runs once, right after the handle was freed."""

    def _on_exit(self, exc_type: Any, exc: Any) -> None:
        """Hook: runs when a ``with`` block ends, before the free."""

    def close(self) -> None:
        """Frees the handle (idempotent; see the class for when the free happens)."""
        self._free()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            self._on_exit(exc_type, exc)
        finally:
            if self._FREE_ON_EXIT:
                self._free()

    def __del__(self) -> None:
        try:
            if getattr(self, "_cv", None) is not None:
                self._free()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass

    def _s(self, name: str) -> str:
        return borrowed_str(name, self)


def _held(f: Any) -> Any:
    """``f`` (a method of an :class:`OwnedHandle`) holding its handle in use while it
    runs; on a closed handle it runs as it is (and fails where it needs the handle)."""

    @functools.wraps(f)
    def held(self: "OwnedHandle", *args: Any, **kwargs: Any) -> Any:
        try:
            self._enter()
        except ArgumentError:
            return f(self, *args, **kwargs)
        try:
            return f(self, *args, **kwargs)
        finally:
            self._leave()

    return held


def cstr(s: Optional[str], what: str = "string") -> Optional[bytes]:
    """Encodes a Python string for a ``const char *`` argument (NUL-terminated UTF-8).
    An interior NUL cannot be represented and is rejected here."""
    if s is None:
        return None
    if not isinstance(s, str):
        raise ArgumentError(f"{what} must be a str, not {type(s).__name__}")
    b = s.encode("utf-8", "surrogatepass")
    if b"\0" in b:
        raise ArgumentError(f"{what} must not contain a NUL character")
    return b


def u64_array(values: Sequence[int], what: str) -> Any:
    vals = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ArgumentError(f"{what} must contain integers")
        if v < 0 or v >= 1 << 64:
            raise ArgumentError(f"{what} values must fit in an unsigned 64-bit integer")
        vals.append(v)
    return (c_uint64 * len(vals))(*vals)


def version() -> str:
    """The loaded library's version string (``MAJOR.MINOR.PATCH``)."""
    return LIB.fn("mws_version")().decode()


def library_path() -> str:
    """The path the shared library was loaded from."""
    _ = LIB.cdll
    return LIB.path


__all__ = [
    "LIB",
    "check",
    "call",
    "borrowed_str",
    "cstr",
    "last_error",
    "status_name",
    "version",
    "library_path",
    "MwsError",
]
