"""Acceptance items 384-386 of ``docs/spec/acceptance-live-transfer.md``: the REAL
Mooncake Transfer Engine from the PyPI wheel, two (or more) processes on 127.0.0.1
over TCP with P2PHANDSHAKE (TE-chosen rpc ports). This checks the wheel's behaviour
that the executors rely on (``docs/mooncake/TRANSFER-ENGINE.md``), with the sizes of
``docs/mooncake/te_smoke.py`` reduced where the items allow.

The driver engine lives in the pytest process; each peer is this file run as a
script (``python test_acc_te_wheel.py peer <info> <size> <seed>``): it registers one
buffer (seeded pattern, or zeros for seed -1), publishes ``{segment, addr, size}``
through an info file and answers ``sha <off> <n>`` lines on stdin with the SHA-256
of that slice of its own memory. Every peer is stopped (or killed) by its PID.

Skipped only when ``mooncake.engine`` is not importable (a failure instead with
``MWS_REQUIRE_MOONCAKE=1``, as on CI).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import pytest

QUEUE_ENV = "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER"
QUEUE_LIMIT = 1024  # the wheel's default per-peer TCP queue
SPACE = 384 << 20  # remote (peer B) and local buffer sizes
RANGES = 10_000  # item 384: 10,000 ranges of 256 B - 64 KiB
SEED_B = 1234
SEED_LOCAL = 5678
PEER_START_S = 30
ATTEMPTS = 4  # item 385: fresh throw-away peers tried until a rejected batch shows landed ranges
KILL_STATUS_BOUND_S = 5.0  # item 386: the status wait returns within 5 s


def pattern(seed: int, n: int) -> bytes:
    chunk = 32 << 20  # randbytes() is limited to < 256 MiB per call
    return b"".join(random.Random(seed * 100003 + i).randbytes(min(chunk, n - off))
                    for i, off in enumerate(range(0, n, chunk)))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- peer


def _new_engine():
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize returned {rc}")
    return engine, f"127.0.0.1:{engine.get_rpc_port()}"


def run_peer(info_path: str, size: int, seed: int) -> int:
    engine, segment = _new_engine()
    if seed >= 0:
        buf = (ctypes.c_char * size).from_buffer_copy(pattern(seed, size))
    else:
        buf = (ctypes.c_char * size)()
    addr = ctypes.addressof(buf)
    rc = engine.register_memory(addr, size)
    if rc != 0:
        print(f"peer register_memory -> {rc}", file=sys.stderr, flush=True)
        return 1
    with open(info_path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "segment": segment, "addr": addr, "size": size}, f)
    os.replace(info_path + ".tmp", info_path)  # atomic publish
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "sha":
            off, n = int(cmd[1]), int(cmd[2])
            print(sha(ctypes.string_at(addr + off, n)), flush=True)
        elif cmd and cmd[0] == "pages":  # pages <off> <page> <count>: one digest per page
            off, page, count = int(cmd[1]), int(cmd[2]), int(cmd[3])
            print(json.dumps([sha(ctypes.string_at(addr + off + i * page, page)) for i in range(count)]), flush=True)
        elif cmd and cmd[0] == "quit":
            break
    engine.unregister_memory(addr)
    del buf
    return 0


class Peer:
    """One peer process (this file as a script), controlled through its stdin."""

    def __init__(self, workdir: str, tag: str, size: int, seed: int) -> None:
        self.info_path = os.path.join(workdir, f"peer-{tag}.json")
        self.log = open(os.path.join(workdir, f"peer-{tag}.log"), "w+")
        env = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1", GLOG_minloglevel="1")
        env.pop(QUEUE_ENV, None)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "peer", self.info_path, str(size), str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        t0 = time.time()
        while not os.path.exists(self.info_path):
            if self.proc.poll() is not None:
                raise AssertionError(f"peer {tag} exited early ({self.proc.returncode}):\n{self.tail()}")
            if time.time() - t0 > PEER_START_S:
                self.kill()
                raise AssertionError(f"peer {tag} did not publish its info within {PEER_START_S}s")
            time.sleep(0.01)
        with open(self.info_path) as f:
            info = json.load(f)
        self.segment, self.addr, self.size = info["segment"], info["addr"], info["size"]

    def tail(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def sha(self, off: int, n: int) -> str:
        self.proc.stdin.write(f"sha {off} {n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        assert line, f"peer gave no digest; log:\n{self.tail()}"
        return line

    def pages(self, off: int, page: int, count: int) -> list[str]:
        self.proc.stdin.write(f"pages {off} {page} {count}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        assert line, f"peer gave no digests; log:\n{self.tail()}"
        return json.loads(line)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 9)  # this peer's own PID
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self.log.close()


# ------------------------------------------------------------------------- driver


def _te_available() -> bool:
    try:
        import mooncake.engine  # noqa: F401
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def te():
    """The driver: an engine in this process with one registered local buffer, and
    peer B (seeded pattern). Yields a namespace; stops everything on exit."""
    if not _te_available():
        if os.environ.get("MWS_REQUIRE_MOONCAKE") == "1":
            pytest.fail("mooncake.engine not importable but MWS_REQUIRE_MOONCAKE=1")
        pytest.skip("mooncake wheel not installed (pip install mooncake-transfer-engine-non-cuda)")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    os.environ.setdefault("GLOG_minloglevel", "1")
    # Item 385 depends on the default queue limit: make sure this engine has it.
    saved = os.environ.pop(QUEUE_ENV, None)
    try:
        engine, segment = _new_engine()
    finally:
        if saved is not None:
            os.environ[QUEUE_ENV] = saved
    with tempfile.TemporaryDirectory(prefix="te-acc-") as workdir:
        buf = (ctypes.c_char * SPACE).from_buffer_copy(pattern(SEED_LOCAL, SPACE))
        laddr = ctypes.addressof(buf)
        assert engine.register_memory(laddr, SPACE) == 0
        peers = []

        class NS:
            pass

        ns = NS()
        ns.engine, ns.segment, ns.workdir, ns.laddr = engine, segment, workdir, laddr

        def spawn(tag: str, size: int, seed: int) -> Peer:
            p = Peer(workdir, tag, size, seed)
            peers.append(p)
            return p

        ns.spawn = spawn
        try:
            ns.b = spawn("B", SPACE, SEED_B)
            ns.b_model = bytearray(pattern(SEED_B, SPACE))  # what B's buffer must hold
            yield ns
        finally:
            for p in peers:
                p.stop()
            assert engine.unregister_memory(laddr) == 0
            del buf


def random_ranges(rng: random.Random, count: int, lo: int, hi: int, space: int) -> list[tuple[int, int]]:
    """``count`` non-overlapping (offset, size) ranges inside [0, space), shuffled."""
    sizes = [rng.randint(lo, hi) for _ in range(count)]
    slack = space - sum(sizes)
    assert slack >= 0, "ranges do not fit"
    gaps = sorted(rng.randint(0, slack) for _ in range(count))
    out, cursor, prev = [], 0, 0
    for size, gap in zip(sizes, gaps):
        cursor += gap - prev
        prev = gap
        out.append((cursor, size))
        cursor += size
    rng.shuffle(out)
    return out


def chunked(fn, seg: str, local: list, remote: list, lengths: list, limit: int) -> tuple[int, int]:
    """One logical batch as sequential TE batches of <= ``limit`` ranges; returns
    (first non-zero rc or 0, number of calls)."""
    calls = 0
    for i in range(0, len(lengths), limit):
        calls += 1
        rc = fn(seg, local[i:i + limit], remote[i:i + limit], lengths[i:i + limit])
        if rc != 0:
            return rc, calls
    return 0, calls


def test_acc_384_ten_thousand_small_ranges_read_and_write_byte_exactly(te):
    """10,000 ranges of 256 B - 64 KiB, issued as batches of <= 1024, are read from
    and written into peer B byte-exactly; the write is verified by SHA-256 computed
    on the peer, the read by comparing every range with the peer's pattern (and the
    peer's own digest of its untouched buffer)."""
    eng, seg, laddr, b = te.engine, te.b.segment, te.laddr, te.b
    rng = random.Random(42)
    rr = random_ranges(rng, RANGES, 256, 64 << 10, SPACE)
    assert len(rr) == RANGES and all(256 <= n <= 64 << 10 for _, n in rr)
    lengths = [n for _, n in rr]
    loc, cursor = [], 0  # local offsets: the same sizes packed from 0
    for n in lengths:
        loc.append(cursor)
        cursor += n
    assert cursor <= SPACE
    # The peer holds exactly its seeded pattern before anything is moved.
    assert b.sha(0, SPACE) == sha(bytes(te.b_model))

    # Read.
    rc, calls = chunked(eng.batch_transfer_sync_read, seg, [laddr + o for o in loc],
                        [b.addr + o for o, _ in rr], lengths, QUEUE_LIMIT)
    assert rc == 0
    assert calls == -(-RANGES // QUEUE_LIMIT)
    model = te.b_model
    bad = [i for i, (lo, (ro, n)) in enumerate(zip(loc, rr)) if ctypes.string_at(laddr + lo, n) != model[ro:ro + n]]
    assert bad == [], f"{len(bad)} of {RANGES} read ranges differ"

    # Write: new bytes into the same 10,000 remote ranges, from shuffled local ranges.
    fresh = pattern(SEED_LOCAL + 1, cursor)
    ctypes.memmove(laddr, fresh, cursor)
    order = list(range(RANGES))
    rng.shuffle(order)
    src = [loc[i] for i in order]
    dst = [rr[i] for i in order]
    rc, calls = chunked(eng.batch_transfer_sync_write, seg, [laddr + s for s in src],
                        [b.addr + o for o, _ in dst], [n for _, n in dst], QUEUE_LIMIT)
    assert rc == 0
    for s, (o, n) in zip(src, dst):
        model[o:o + n] = fresh[s:s + n]
    assert b.sha(0, SPACE) == sha(bytes(model)), "peer B's buffer differs from the written model"


def test_acc_385_one_batch_over_the_queue_limit_returns_minus_one_but_lands(te):
    """One batch of 4 x 1024 writes to a throw-away peer D (an overflow can wedge
    that peer's connection): the wheel's call returns -1 although ranges of it have
    landed, so -1 is not proof that nothing was written (the executors treat it as
    completion unknown, restart-required: item 360).

    How much of a rejected batch lands is timing-dependent (measured 0, 56 and 2054
    of 4096 in three runs), so every attempt must return -1, and at least one of up
    to ``ATTEMPTS`` attempts (each against a fresh peer D) must show landed ranges."""
    eng, laddr = te.engine, te.laddr
    over = 4 * QUEUE_LIMIT
    lo = [laddr + i * 4096 for i in range(over)]
    want = [sha(ctypes.string_at(a, 4096)) for a in lo]
    # The local source pages are random: none equals a zero-filled page of D.
    assert sha(bytes(4096)) not in want
    counts = []
    for attempt in range(ATTEMPTS):
        d = te.spawn(f"D{attempt}", 64 << 20, -1)  # zero-filled
        ro = [d.addr + i * 4096 for i in range(over)]
        rc = eng.batch_transfer_sync_write(d.segment, lo, ro, [4096] * over)
        assert rc == -1, f"an over-limit batch returned {rc}"
        landed = 0
        for wait_s in (0.5, 1.0):  # admitted parts of the failed batch may still be in flight
            time.sleep(wait_s)
            landed = sum(g == w for g, w in zip(d.pages(0, 4096, over), want))
            if landed:
                break
        d.stop()
        counts.append(landed)
        if landed:
            break
    print(f"over-limit batches of {over} ranges: rc -1 each; ranges landed per attempt: {counts}")
    assert counts[-1] > 0, f"no range of {len(counts)} rejected batches landed"
    # Another peer is unaffected.
    assert eng.transfer_sync_read(te.b.segment, laddr, te.b.addr, 4096) == 0


def test_acc_386_killed_peer_fails_the_status_wait_and_later_calls(te):
    """Peer C is killed right after an async submit of 384 x 4 MiB reads: the
    blocking status wait returns -1 within 5 s (not a hang), later sync calls to C
    return -1, and a call to the live peer B still returns 0."""
    eng, laddr = te.engine, te.laddr
    c = te.spawn("C", 256 << 20, SEED_B + 1)
    assert eng.transfer_sync_read(c.segment, laddr, c.addr, 4096) == 0  # warm-up
    chunk = 4 << 20
    nchunks = (256 << 20) // chunk
    n = 384  # <= the per-peer queue: only the kill can fail it
    lo = [laddr + (i % nchunks) * chunk for i in range(n)]
    ro = [c.addr + (i % nchunks) * chunk for i in range(n)]
    t0 = time.perf_counter()
    bid = eng.batch_transfer_async_read(c.segment, lo, ro, [chunk] * n)
    c.kill()
    killed_ms = (time.perf_counter() - t0) * 1e3
    assert bid != 0, "async submit returned no batch id"
    st = eng.get_batch_transfer_status([bid])  # blocking; frees the id
    status_s = time.perf_counter() - t0
    assert st == -1, f"status of a batch whose peer died: {st}"
    assert status_s < KILL_STATUS_BOUND_S, f"status wait took {status_s:.2f}s"
    t1 = time.perf_counter()
    assert eng.transfer_sync_read(c.segment, laddr, c.addr, 4096) == -1
    assert eng.batch_transfer_sync_read(c.segment, [laddr], [c.addr], [4096]) == -1
    dead_s = time.perf_counter() - t1
    assert eng.transfer_sync_read(te.b.segment, laddr, te.b.addr, 4096) == 0
    print(f"peer killed {killed_ms:.1f} ms after submit; status -1 after {status_s * 1e3:.0f} ms; "
          f"two calls to the dead peer took {dead_s:.2f}s")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "peer":
        sys.exit(run_peer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    sys.exit("usage: test_acc_te_wheel.py peer <info> <size> <seed>")
