"""Raw addresses of Python objects that export the buffer protocol.

:class:`BufferRef` holds a buffer export (``PyObject_GetBuffer``) for as long as it
lives, so the exporter (``bytearray``, ``mmap``, ``numpy.ndarray``, ``array.array``,
a ctypes array, ...) cannot be resized or freed while the library may use the
address. Release it with :meth:`BufferRef.release` (or use it as a context manager).
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_ssize_t, c_void_p, py_object
from typing import Any, Optional

from .errors import ArgumentError

__all__ = ["BufferRef", "HostBuffer"]

PyBUF_SIMPLE = 0
PyBUF_WRITABLE = 0x0001
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND
PyBUF_C_CONTIGUOUS = 0x0020 | PyBUF_STRIDES
PyBUF_ANY_CONTIGUOUS = 0x0080 | PyBUF_STRIDES


class _Py_buffer(Structure):
    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", POINTER(c_ssize_t)),
        ("strides", POINTER(c_ssize_t)),
        ("suboffsets", POINTER(c_ssize_t)),
        ("internal", c_void_p),
    ]


_get = ctypes.pythonapi.PyObject_GetBuffer
_get.argtypes = [py_object, POINTER(_Py_buffer), c_int]
_get.restype = c_int
_release = ctypes.pythonapi.PyBuffer_Release
_release.argtypes = [POINTER(_Py_buffer)]
_release.restype = None


class BufferRef:
    """A held, C-contiguous buffer export of ``obj``: ``address`` and ``nbytes``.

    Args:
        obj: any object exporting a C-contiguous buffer.
        writable: require a writable buffer (restore targets). Read-only exports
            (``bytes``) are accepted only when ``writable`` is false.
    """

    __slots__ = ("_view", "_held", "address", "nbytes", "readonly", "obj")

    def __init__(self, obj: Any, writable: bool = False) -> None:
        view = _Py_buffer()
        flags = PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0)
        # PyObject_GetBuffer raises (BufferError / TypeError) through ctypes.pythonapi.
        _get(obj, ctypes.byref(view), flags)
        self._view = view
        self._held = True
        self.obj = obj
        self.address: int = view.buf or 0
        self.nbytes: int = view.len
        self.readonly: bool = bool(view.readonly)
        if self.nbytes > 0 and not self.address:
            self.release()
            raise BufferError("buffer export has a NULL address")

    def release(self) -> None:
        """Releases the export (idempotent)."""
        if getattr(self, "_held", False):
            self._held = False
            _release(ctypes.byref(self._view))
            self.obj = None

    @property
    def held(self) -> bool:
        return self._held

    def __enter__(self) -> "BufferRef":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"BufferRef(nbytes={self.nbytes}, readonly={self.readonly}, held={self._held})"


class HostBuffer:
    """A zero-initialized, page-independent host buffer (a ``bytearray``) with a stable
    address: convenient for tests, benchmarks and staging."""

    __slots__ = ("data", "_ref")

    def __init__(self, nbytes: int, fill: Optional[bytes] = None) -> None:
        if fill is not None:
            if len(fill) != nbytes:
                raise ArgumentError("fill must have exactly nbytes bytes")
            self.data = bytearray(fill)
        else:
            self.data = bytearray(nbytes)
        self._ref = BufferRef(self.data, writable=True) if nbytes else None

    @property
    def address(self) -> int:
        return self._ref.address if self._ref else 0

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def release(self) -> None:
        if self._ref is not None:
            self._ref.release()
            self._ref = None
