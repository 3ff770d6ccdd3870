"""Progress reports of long calls (``mws_progress``).

Uploads (:meth:`Store.upload`, the snapshot :class:`Writer`), restores
(:meth:`Store.load`, :meth:`Store.restore`) and live transfers (:class:`Loader`) take a
``progress`` callable. It is called on the calling thread, inside the call: once at the
start (0 done), at most every 100 ms while it runs, and once when the data phase is
done, with a :class:`Progress`. Keep it quick, and do not call back into the object
that reports. An exception it raises is swallowed (it never reaches the library) and
kept in :attr:`ProgressCallback.errors`.

:class:`ProgressBar` is a ready-made callable that draws a one-line bar on a terminal.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, TextIO

from . import _abi

__all__ = ["Progress", "ProgressBar", "ProgressCallback"]

_PHASES = {_abi.MWS_PROGRESS_UPLOAD: "upload", _abi.MWS_PROGRESS_RESTORE: "restore",
           _abi.MWS_PROGRESS_TRANSFER: "transfer", _abi.MWS_PROGRESS_VERIFY: "verify"}


@dataclass(frozen=True)
class Progress:
    """One report: how much of the current call's work has completed.

    ``phase`` is ``"upload"`` (items: objects), ``"restore"`` (items: transfer
    regions), ``"transfer"`` (items: engine operations) or ``"verify"``."""

    phase: str
    bytes_done: int
    bytes_total: int
    items_done: int
    items_total: int

    @property
    def fraction(self) -> float:
        """Bytes done over bytes total (1.0 for an empty call)."""
        return 1.0 if self.bytes_total == 0 else self.bytes_done / self.bytes_total

    @property
    def done(self) -> bool:
        """True on the final report of a call."""
        return self.bytes_done == self.bytes_total and self.items_done == self.items_total


class ProgressCallback:
    """A Python callable wrapped as an ``mws_progress_fn`` (keep this object alive
    while the library may call it)."""

    def __init__(self, fn: Callable[[Progress], Any]) -> None:
        self.fn = fn
        self.errors: List[str] = []

        def trampoline(_ctx: Any, p: Any) -> None:
            try:
                c = p.contents
                fn(Progress(_PHASES.get(int(c.phase), str(int(c.phase))), int(c.bytes_done), int(c.bytes_total),
                            int(c.items_done), int(c.items_total)))
            except BaseException as e:  # noqa: BLE001 - nothing may unwind into the library
                self.errors.append(f"{type(e).__name__}: {e}")

        self.c_fn = _abi.PROGRESS_FN(trampoline)


def c_progress(fn: Optional[Callable[[Progress], object]]) -> "tuple[Any, Optional[ProgressCallback]]":
    """``(ctypes function, keep-alive)`` for ``fn``; a NULL function for ``None``."""
    if fn is None:
        return _abi.PROGRESS_FN(), None
    cb = fn if isinstance(fn, ProgressCallback) else ProgressCallback(fn)
    return cb.c_fn, cb


class ProgressBar:
    """A progress callable that draws ``label [#####.....]  42% 1.2/2.9 GiB 1.1 GB/s``
    on ``stream`` (default stderr), redrawn in place on a terminal and printed once at
    the end otherwise. Works for several calls in a row (each starts a new bar)."""

    def __init__(self, label: str = "", stream: Optional[TextIO] = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._start = time.monotonic()
        self.last: Optional[Progress] = None

    def __call__(self, p: Progress) -> None:
        if p.bytes_done == 0 and not p.done:
            self._start = time.monotonic()
        self.last = p
        tty = getattr(self.stream, "isatty", lambda: False)()
        if not tty and not p.done:
            return
        filled = int(self.width * p.fraction)
        secs = max(time.monotonic() - self._start, 1e-9)
        line = (f"{self.label or p.phase} [{'#' * filled}{'.' * (self.width - filled)}] {100 * p.fraction:5.1f}% "
                f"{p.bytes_done / 2**30:.2f}/{p.bytes_total / 2**30:.2f} GiB {p.bytes_done / secs / 1e9:.2f} GB/s "
                f"{p.items_done}/{p.items_total}")
        self.stream.write(("\r" if tty else "") + line + ("\n" if p.done else ""))
        self.stream.flush()
