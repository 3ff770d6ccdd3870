"""Status codes and exceptions of the C ABI.

Every fallible ``mws_`` function returns an ``mws_status``; a non-zero status is
raised as an :class:`MwsError` subclass that carries the numeric status, its name and
the thread-local detail message (``mws_last_error_message()``) of the failed call.
"""

from __future__ import annotations

import enum
from typing import Dict, Optional, Type

__all__ = [
    "Status",
    "MwsError",
    "NullArgumentError",
    "PanicError",
    "InvalidUtf8Error",
    "InvalidArgumentError",
    "InvalidBindingError",
    "InvalidManifestError",
    "NotFoundError",
    "AlreadyExistsError",
    "ConflictError",
    "StaleBindingError",
    "LimitExceededError",
    "UnsupportedError",
    "StoreError",
    "LocalIOError",
    "IntegrityError",
    "MissingSymbolError",
    "LocalError",
    "ArgumentError",
    "OutOfRangeError",
    "LibraryNotFoundError",
    "error_for_status",
]


class Status(enum.IntEnum):
    """Values of the C enum ``mws_status`` (stable, never renumbered)."""

    OK = 0
    NULL_ARGUMENT = 1
    PANIC = 2
    INVALID_UTF8 = 3
    INVALID_ARGUMENT = 4
    INVALID_BINDING = 5
    INVALID_MANIFEST = 6
    NOT_FOUND = 7
    ALREADY_EXISTS = 8
    CONFLICT = 9
    STALE_BINDING = 10
    LIMIT_EXCEEDED = 11
    UNSUPPORTED = 12
    STORE = 13
    IO = 14
    INTEGRITY = 15


class MwsError(Exception):
    """A failed ``mws_`` call.

    Attributes:
        status: the numeric ``mws_status`` (an :class:`int`; a :class:`Status` when known).
        status_name: the C name of the status, e.g. ``"MWS_CONFLICT"``.
        message: the library's detail message (names the failing function and the
            offending id or key; never contains a runtime address).
    """

    status: int
    status_name: str
    message: str

    def __init__(self, status: int, message: str = "", status_name: Optional[str] = None) -> None:
        try:
            st: int = Status(status)
        except ValueError:
            st = int(status)
        self.status = st
        self.status_name = status_name or (
            f"MWS_{st.name}" if isinstance(st, Status) else "MWS_UNKNOWN_STATUS"
        )
        self.message = message
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)

    def __reduce__(self):  # picklable across processes (multiprocessing)
        return (type(self), (int(self.status), self.message, self.status_name))


class LocalError(MwsError):
    """An error raised by the Python layer itself (not returned by a C call), with the
    status a C call would have returned for it: ``status`` is the class's default, or
    the status of the library error it wraps (then also its ``__cause__``).

    Construct it with a message: ``StateDictError("...")``, or
    ``StateDictError("...", status=Status.CONFLICT)``."""

    default_status: int = Status.INVALID_ARGUMENT

    def __init__(self, message: str = "", status: Optional[int] = None, status_name: Optional[str] = None) -> None:
        super().__init__(self.default_status if status is None else status, message, status_name)
        # The text is the message alone, as a plain Python exception's would be.
        Exception.__init__(self, message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # picklable across processes (multiprocessing)
        return (type(self), (self.message, int(self.status), self.status_name))


class ArgumentError(LocalError, ValueError, TypeError):
    """A Python argument of the wrong type or value, caught before any C call (status
    ``INVALID_ARGUMENT``; also a ``ValueError`` and a ``TypeError``)."""


class OutOfRangeError(LocalError, IndexError):
    """An index past the end of a sequence (status ``INVALID_ARGUMENT``; also an
    ``IndexError``)."""


class LibraryNotFoundError(LocalError, OSError):
    """The shared library could not be loaded (status ``UNSUPPORTED``; also an
    ``OSError``)."""

    default_status = Status.UNSUPPORTED


class NullArgumentError(MwsError, ValueError):
    """MWS_NULL_ARGUMENT: a required pointer was NULL (a binding bug)."""


class PanicError(MwsError, RuntimeError):
    """MWS_PANIC: an internal error was caught at the ABI boundary."""


class InvalidUtf8Error(MwsError, ValueError):
    """MWS_INVALID_UTF8."""


class InvalidArgumentError(MwsError, ValueError):
    """MWS_INVALID_ARGUMENT: invalid input; retrying cannot help."""


class InvalidBindingError(MwsError, ValueError):
    """MWS_INVALID_BINDING: a runtime binding does not pair with its placement."""


class InvalidManifestError(MwsError, ValueError):
    """MWS_INVALID_MANIFEST: a manifest or decision record read back is invalid."""


class NotFoundError(MwsError, LookupError):
    """MWS_NOT_FOUND: a key or object does not exist."""


class AlreadyExistsError(MwsError):
    """MWS_ALREADY_EXISTS: a create-only write found the key present."""


class ConflictError(MwsError):
    """MWS_CONFLICT: a transaction lost a race, or a decision conflicts with the plan."""


class StaleBindingError(MwsError):
    """MWS_STALE_BINDING: runtime evidence no longer matches the plan."""


class LimitExceededError(MwsError):
    """MWS_LIMIT_EXCEEDED: a planning or resource limit was exceeded."""


class UnsupportedError(MwsError):
    """MWS_UNSUPPORTED: a feature or memory kind is not supported here."""


class StoreError(MwsError, RuntimeError):
    """MWS_STORE: the store backend failed; the operation may be retried."""


class LocalIOError(MwsError, OSError):
    """MWS_IO: local I/O failed."""


class IntegrityError(MwsError):
    """MWS_INTEGRITY: data read back does not match what was expected."""


class MissingSymbolError(MwsError, NotImplementedError):
    """The loaded shared library does not export a function this binding needs
    (an older library than the Python package)."""

    def __init__(self, symbol: str, library: str = "") -> None:
        self.symbol = symbol
        super().__init__(
            int(Status.UNSUPPORTED),
            f"{symbol} is not exported by {library or 'the loaded library'}",
            "MWS_UNSUPPORTED",
        )

    def __reduce__(self):
        return (type(self), (self.symbol,))


_BY_STATUS: Dict[int, Type[MwsError]] = {
    Status.NULL_ARGUMENT: NullArgumentError,
    Status.PANIC: PanicError,
    Status.INVALID_UTF8: InvalidUtf8Error,
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.INVALID_BINDING: InvalidBindingError,
    Status.INVALID_MANIFEST: InvalidManifestError,
    Status.NOT_FOUND: NotFoundError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.CONFLICT: ConflictError,
    Status.STALE_BINDING: StaleBindingError,
    Status.LIMIT_EXCEEDED: LimitExceededError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.STORE: StoreError,
    Status.IO: LocalIOError,
    Status.INTEGRITY: IntegrityError,
}


def error_for_status(status: int, message: str = "", status_name: Optional[str] = None) -> MwsError:
    """Builds the exception for a non-zero ``mws_status``."""
    cls = _BY_STATUS.get(int(status), MwsError)
    return cls(int(status), message, status_name)
