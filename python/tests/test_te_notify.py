"""Notifications over the real Transfer Engine wheel (two engines in one process,
127.0.0.1, tcp): ``MooncakeEngineBackend.send_notify`` carries each message on a
one-byte read of the peer's first registered buffer (the peer's bytes stay as they
are), ``poll_notifies`` drains them in order. The cluster test's delta phase uses
this channel for the notified steps across hosts."""

from __future__ import annotations

import ctypes
import os

import pytest

import mooncake_weight_store as mws


def _wheel():
    try:
        import mooncake.engine  # noqa: F401
    except ImportError:
        if os.environ.get("MWS_REQUIRE_MOONCAKE") == "1":
            pytest.fail("mooncake.engine not importable but MWS_REQUIRE_MOONCAKE=1")
        pytest.skip("mooncake wheel not installed (pip install mooncake-transfer-engine-non-cuda)")
    from mooncake_weight_store.te_backend import MooncakeTransferEngine

    return MooncakeTransferEngine


def test_send_notify_rides_a_read_and_polls_in_order():
    te_cls = _wheel()
    a, b = te_cls(hostname="127.0.0.1"), te_cls(hostname="127.0.0.1")
    peer = ctypes.create_string_buffer(b"P" * 4096, 4096)
    assert b.te.register_memory(ctypes.addressof(peer), 4096, "*") == 0
    msgs = [f"MWS-NOTIFY/1 test {i}\n{{\"n\":{i}}}".encode() + b"x" * (i * 1000) for i in range(3)]
    for m in msgs:
        assert a._adapter.send_notify(b.segment, "mooncake_weight_store.notify", m) == 0
    got = b.poll_notifies()
    assert got == [("mooncake_weight_store.notify", m) for m in msgs]
    assert b.poll_notifies() == []
    assert peer.raw == b"P" * 4096  # the carrier only reads
    assert a._adapter.notify_scratch is not None
    a.close()
    assert a._adapter.notify_scratch is None
    assert b.te.unregister_memory(ctypes.addressof(peer)) == 0
    b.close()


def test_send_notify_fails_without_a_peer_buffer():
    te_cls = _wheel()
    a, b = te_cls(hostname="127.0.0.1"), te_cls(hostname="127.0.0.1")
    assert a._adapter.send_notify(b.segment, "n", b"hello") != 0
    assert b.poll_notifies() == []
    a.close()
    b.close()
