"""Routes the library's log records into Python's :mod:`logging` (or any callable).

The library logs through Rust's ``log`` facade: plan sizes, commits, recoveries,
retries of transient store codes, quarantined registrations and slow store calls.
:func:`set_log_callback` installs a C callback (``mws_set_log_callback``) that hands
every record at or above ``level`` to ``fn(level, target, message)``; the default
``fn`` forwards to the ``logging`` logger ``mooncake_weight_store.native``.

The callback runs on whatever thread runs library code (ctypes takes the GIL). An
exception it raises is swallowed (it must never unwind into the library).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from .errors import ArgumentError
from . import _abi, _lib

OFF, ERROR, WARN, INFO, DEBUG, TRACE = (_abi.MWS_LOG_OFF, _abi.MWS_LOG_ERROR, _abi.MWS_LOG_WARN, _abi.MWS_LOG_INFO,
                                       _abi.MWS_LOG_DEBUG, _abi.MWS_LOG_TRACE)

_PY_LEVEL = {ERROR: logging.ERROR, WARN: logging.WARNING, INFO: logging.INFO, DEBUG: logging.DEBUG, TRACE: 5}
_native = logging.getLogger("mooncake_weight_store.native")
_lock = threading.Lock()
_installed: Optional[object] = None  # keeps the ctypes thunk alive while installed


def _to_logging(level: int, target: str, message: str) -> None:
    _native.log(_PY_LEVEL.get(level, logging.INFO), "%s: %s", target, message)


def set_log_callback(fn: Optional[Callable[[int, str, str], None]] = _to_logging, level: int = INFO) -> None:
    """Installs ``fn(level, target, message)`` for records of ``level`` (1 error ..
    5 trace) or more severe; ``fn=None`` or ``level=OFF`` removes it. Replaces any
    previous callback (which is never called again once this returns)."""
    global _installed
    if level not in range(0, 6):
        raise ArgumentError(f"log level must be 0..5, got {level}")
    with _lock:
        if fn is None or level == OFF:
            _lib.call("mws_set_log_callback", OFF, _abi.LOG_FN(), None)
            _installed = None
            return

        def thunk(_ctx, lvl, target, message):  # type: ignore[no-untyped-def]
            try:
                fn(int(lvl), (target or b"").decode("utf-8", "replace"), (message or b"").decode("utf-8", "replace"))
            except BaseException:  # noqa: BLE001  (never unwind into the library)
                pass

        c_fn = _abi.LOG_FN(thunk)
        _lib.call("mws_set_log_callback", int(level), c_fn, None)
        _installed = c_fn
