"""Fixtures: the library, and a live Mooncake Store on loopback.

``MOONCAKE_MASTER=host:port`` (set by ``.ci/python.sh``) points the tests at a running
``mooncake_master``; without it, a master is started here when the ``mooncake``
wheel is importable. With ``MWS_REQUIRE_MOONCAKE=1`` (CI) a missing Mooncake fails
instead of skipping.

The ``torch`` fixture is the ``torch`` module (CPU tensors are enough); without torch
the tests that use it skip, unless ``MWS_REQUIRE_TORCH=1`` (CI): then they fail, and so
does any other test that skips for a reason naming torch (``pytest.importorskip``).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")

CONFORMANCE = Path(os.environ.get("MWS_CONFORMANCE_DIR", HERE.parents[1] / "tests" / "fixtures" / "conformance"))


def pytest_report_header(config):
    import mooncake_weight_store as mws

    return [f"mooncake_weight_store {mws.__file__}", f"library {mws.library_path()} ({mws.version()})",
            f"mooncake master {os.environ.get('MOONCAKE_MASTER', '(started by the tests)')}"]


def _mooncake_available() -> bool:
    try:
        import mooncake.store  # noqa: F401
        return True
    except Exception:
        return False


def _require_torch() -> bool:
    return os.environ.get("MWS_REQUIRE_TORCH") == "1"


@pytest.fixture(scope="session")
def torch():
    """The ``torch`` module; skips without it (fails with ``MWS_REQUIRE_TORCH=1``)."""
    try:
        import torch as t
    except Exception as e:  # noqa: BLE001 - a broken install (missing libraries) is "no torch" too
        if _require_torch():
            pytest.fail(f"torch not importable ({type(e).__name__}: {e}) but MWS_REQUIRE_TORCH=1")
        pytest.skip(f"torch not importable ({type(e).__name__}: {e})")
    return t


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With ``MWS_REQUIRE_TORCH=1`` a skip whose reason names torch is a failure."""
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and _require_torch():
        # a skip's longrepr is (path, line, reason); the path may name torch itself
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if "torch" in reason.lower():
            rep.outcome = "failed"
            rep.longrepr = f"skipped, but MWS_REQUIRE_TORCH=1: {reason}"


@pytest.fixture(scope="session")
def conformance_dir() -> Path:
    if not CONFORMANCE.is_dir():
        pytest.skip(f"conformance fixtures not found at {CONFORMANCE}")
    return CONFORMANCE


@pytest.fixture(scope="session")
def master():
    """``host:port`` of a live mooncake_master."""
    addr = os.environ.get("MOONCAKE_MASTER")
    if addr:
        yield addr
        return
    if not _mooncake_available():
        if os.environ.get("MWS_REQUIRE_MOONCAKE") == "1":
            pytest.fail("mooncake wheel not importable but MWS_REQUIRE_MOONCAKE=1")
        pytest.skip("mooncake wheel not installed (pip install mooncake-transfer-engine-non-cuda)")
    from mooncake_weight_store.mooncake_backend import MooncakeMaster

    with MooncakeMaster() as m:
        yield m.address


@pytest.fixture(scope="session")
def holder(master):
    """This process's Mooncake client; it contributes the memory segment that every
    test's objects live in (subprocess clients are pure clients: their bytes cross
    TCP to this process)."""
    from mooncake_weight_store.mooncake_backend import MooncakeStoreBackend

    be = MooncakeStoreBackend.connect(master, global_segment_size=512 << 20, local_buffer_size=64 << 20)
    yield be
    be.close()


@pytest.fixture
def prefix() -> str:
    """A key prefix unique to the test (tests share one live store)."""
    return f"mwstest/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def mc_store(holder, prefix):
    from mooncake_weight_store import Store

    s = Store.from_backend(holder, key_prefix=prefix)
    yield s
    assert s.callback_errors == []
    s.close()
    holder.remove_prefix(prefix)
