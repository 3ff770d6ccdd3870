"""C++ processes on the REAL Mooncake Store: store_role processes (the adapter
mooncake_weight_store::mooncake_store over each process's own mooncake::RealClient) on
a mooncake_master on loopback. A `hold` process contributes the pool's memory; every
trainer/server is a pure client (segment 0), so its bytes cross the TCP transport and
a killed trainer loses nothing but its own work. Every child and the master are
stopped by their PID on every exit path.

    python3 store_real.py store_selftest | store_two_process | store_revisions |
                          store_corrupt | store_kill | store_cross_language |
                          store_and_te

Environment (ctest, cpp_tests/mooncake/CMakeLists.txt): MWS_STORE_ROLE (the C++ role
binary), MWS_STORE_TE_ROLE (store_te_role: both adapters in one process),
MWS_MOONCAKE_BIN (the wheel's mooncake/ folder with mooncake_master),
MWS_MOONCAKE_MASTER (host:port of a running master; unset: one is started here on
free loopback ports), MWS_MOONCAKE_PYTHON, MWS_REPO, MWS_LIBRARY (the Python side).
Prints "mooncake <case>: OK" on success. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

ROLE = os.environ.get("MWS_STORE_ROLE", "")
TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)
    print(f"  ok: {what}", flush=True)


class Master:
    """A mooncake_master on free loopback ports, stopped by PID (or a given one)."""

    def __init__(self, logdir: str) -> None:
        self.proc = None
        given = os.environ.get("MWS_MOONCAKE_MASTER")
        if given:
            self.address = given
            return
        binary = os.path.join(os.environ["MWS_MOONCAKE_BIN"], "mooncake_master")
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.log = open(os.path.join(logdir, "master.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--rpc_address=127.0.0.1", f"--rpc_port={port}", "--metrics_host=127.0.0.1",
             f"--metrics_port={free_port()}", "--default_kv_lease_ttl=500ms", "--enable_metric_reporting=false",
             "--logtostderr"], stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mooncake_master exited {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), 0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mooncake_master did not open its port")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Run:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="mws-store-real-")
        self.master = Master(self.dir)
        self.children: list = []
        self.n = 0
        self.ns = "cpp-" + uuid.uuid4().hex[:8]

    def env(self) -> dict:
        return dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1", GLOG_minloglevel="2")

    def start(self, *args: str) -> subprocess.Popen:
        self.n += 1
        err = open(os.path.join(self.dir, f"{self.n}-{args[0]}.stderr"), "w")
        p = subprocess.Popen([ROLE, self.master.address, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=err, text=True, env=self.env())
        p.errpath = err.name  # type: ignore[attr-defined]
        self.children.append(p)
        return p

    def role(self, *args: str, expect_rc: int = 0) -> list:
        """Runs one store_role command to its end; its JSON lines."""
        p = self.start(*args)
        out, _ = p.communicate(timeout=TIMEOUT_S)
        lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
        if p.returncode != expect_rc:
            with open(p.errpath) as f:  # type: ignore[attr-defined]
                tail = f.read()[-3000:]
            raise AssertionError(f"store_role {' '.join(args)} exited {p.returncode} (want {expect_rc}): {lines}\n{tail}")
        return lines

    def hold(self, mib: int = 512) -> subprocess.Popen:
        p = self.start("hold", str(mib))
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert json.loads(line).get("ready"), line
        return p

    def close(self) -> None:
        for p in self.children:
            if p.poll() is None:
                try:
                    p.stdin.write("quit\n")  # type: ignore[union-attr]
                    p.stdin.flush()  # type: ignore[union-attr]
                    p.wait(15)
                except Exception:  # noqa: BLE001
                    p.kill()
                    p.wait()
        self.master.stop()


def last(lines: list, op: str) -> dict:
    for x in reversed(lines):
        if x.get("op") == op:
            return x
    raise AssertionError(f"no {op} result in {lines}")


def snapshot(run: Run, rev: str, layers: int) -> dict:
    t = last(run.role("snapshot", run.ns, rev, str(layers)), "snapshot")
    print(f"    snapshot {rev}: {t['fragments']} fragments, {t['bytes']} bytes in {t['ms']:.0f} ms, "
          f"{t['batch_put_calls']} batch_put_from calls ({t['batch_put_items']} items)")
    return t


def restore(run: Run, manifest: str, layers: int) -> dict:
    r = last(run.role("restore", manifest, str(layers)), "restore")
    print(f"    restore {r['revision']}: {r['bytes']} bytes, {r['verified']} verified, {r['ranges']} ranges in "
          f"{r['requests']} requests ({r['range_calls']} get_into_ranges calls), {r['ms']:.0f} ms")
    return r


def case_store_selftest(run: Run) -> None:
    run.hold()
    lines = run.role("selftest")
    s = last(lines, "selftest")
    check(s["self_test"] == 0, "Adapter::self_test: put/get 64 KiB through registered memory, bytes equal")
    check(s["get_size_missing"] == -704 and s["exists_missing"] == 0, "missing key: get_size -704, exists 0")
    check(s["remove_missing"] in (0, -704), "force remove of a missing key: 0 or -704 (success)")
    check(s["put"] == 0, "put (put_from, metadata record) -> 0")
    check(s["batch_get_size"] == [0, 14, -704], "batch_get_size via batch_get_replica_desc: [14, -704]")
    check(s["batch_exists"] == [0, 1, 0], "batch_exists via batchIsExist: [1, 0]")
    check(s["get_into_small"] < 0, f"get_into into a too-small buffer -> {s['get_into_small']}")
    check(s["remove"] == 0 and s["name_704"] == "OBJECT_NOT_FOUND", "force remove -> 0; toString(-704)")
    r = last(lines, "ranges")
    check(r["put"] == 0 and r["register"] == 0 and r["rc"] == 0 and r["unregister"] == 0 and r["remove"] == 0,
          "ranged reads: put, register_buffer, get_into_ranges, unregister_buffer, remove -> 0")
    check(r["results"] == [9, 4, 5, -704, 2, 6], f"get_into_ranges results per range {r['results']}")
    want = "hello" + "." * 15 + " mooncake" + "." * 11 + "3456" + "." * 16 + "01" + "." * 8 + "234567" + ".."
    check(r["bytes"] == want, "whole k1 in two pieces, k2 [3,7) and [0,2)+[2,8) at their destinations, nothing else")
    check(r["batch_query"] == 1 and r["multi_buffers"] == 1,
          "one batch_query for the unsized keys, k1 (sized by batch_get_size, tiled) read whole by one "
          "batch_get_into_multi_buffers")
    t = last(lines, "stale_size")
    check(t["upsert"] == 0 and t["rc"] == 0 and t["results"] == [5, 9] and t["bytes"] == "HELLO" + "." * 5 + " MOONCAKE",
          "k1 grown to 16 bytes: its two pieces (tiling the remembered 14) read as ranges, bytes of the new value")
    check(t["multi_buffers"] == 1 and t["batch_query"] == 1,
          "the whole-object read was tried, refused, and get_into_ranges read the ranges after one batch_query")


def case_store_two_process(run: Run) -> None:
    run.hold()
    t = snapshot(run, "rev-1", 2)
    r = restore(run, t["manifest"], 2)
    check(r["verified"] > 0 and r["bytes"] > 0, "C++ trainer TP4xPP2xDP2 -> Mooncake Store -> C++ server TP2xEP2, every byte")
    check(r["range_calls"] > 0, "the restore read through get_into_ranges")


def case_store_revisions(run: Run) -> None:
    run.hold()
    t1 = snapshot(run, "rev-1", 2)
    t2 = snapshot(run, "rev-2", 4)
    check(t1["manifest"] != t2["manifest"], "two revisions at two manifest keys")
    lst = last(run.role("revisions", run.ns), "revisions")
    got = [(r["revision"], r["generation"], r["manifest"]) for r in lst["revisions"]]
    check(got == [("rev-1", 2, t1["manifest"]), ("rev-2", 4, t2["manifest"])],
          "Store::revisions lists both revisions, oldest first, through the revision index (Mooncake cannot list keys)")
    check(lst["latest"] == t2["manifest"], "Store::latest is the newer one")
    restore(run, lst["revisions"][-1]["manifest"], 4)
    restore(run, lst["revisions"][0]["manifest"], 2)
    check(True, "the newer (4 layers) and then the older revision (2 layers) restored by their listed keys, every byte")


def case_store_corrupt(run: Run) -> None:
    run.hold()
    plan = last(run.role("snapshot", run.ns, "rev-c", "2"), "plan")
    c = last(run.role("corrupt", plan["payload_key"], plan["group"]), "corrupt")
    check(c["rc"] == 0, f"payload object {plan['payload_key']} overwritten with upsert_from ({c['bytes']} bytes)")
    lines = run.role("restore", plan["manifest"], "2", expect_rc=3)
    check(lines[-1].get("error") == "MWS_INTEGRITY", f"restore refused: {lines[-1].get('message', '')[:160]}")


def case_store_kill(run: Run) -> None:
    run.hold()
    p = run.start("snapshot", run.ns, "rev-k", "2", "pause")
    plan = json.loads(p.stdout.readline())  # type: ignore[union-attr]
    paused = json.loads(p.stdout.readline())  # type: ignore[union-attr]
    check(paused.get("paused") is True, f"trainer paused mid-snapshot after {paused.get('bytes_done')} bytes")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(30)
    check(p.returncode == -signal.SIGKILL, "trainer killed (SIGKILL) mid-snapshot")
    lines = run.role("restore", plan["manifest"], "2", expect_rc=3)
    check(lines[-1].get("error") == "MWS_NOT_FOUND", f"no torn revision readable: {lines[-1].get('error')}")
    lst = last(run.role("revisions", run.ns), "revisions")
    check(lst["count"] == 0, "the killed snapshot is not listed (it never reached its commit)")
    t = snapshot(run, "rev-k", 2)
    restore(run, t["manifest"], 2)
    check(True, "the next snapshot of the same revision committed and restores, every byte")
    lst = last(run.role("revisions", run.ns), "revisions")
    check([r["manifest"] for r in lst["revisions"]] == [t["manifest"]], "and it is listed, once")


def with_snapshot(run: Run, program_var: str, rev: str) -> tuple:
    """(the program the environment variable `program_var` names, a C++ trainer's
    snapshot of revision `rev`, 2 layers, in the pool of a `hold` process)."""
    program = os.environ.get(program_var, "")
    if not program:
        raise AssertionError(f"{program_var} not set")
    run.hold()
    return program, snapshot(run, rev, 2)


def case_store_cross_language(run: Run) -> None:
    py, t = with_snapshot(run, "MWS_MOONCAKE_PYTHON", "rev-x")
    env = dict(run.env(), PYTHONPATH=os.path.join(os.environ["MWS_REPO"], "python"))
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([py, os.path.join(here, "store_py_role.py"), run.master.address, "restore", t["manifest"]],
                         capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    ok = out.returncode == 0 and "PY_RESTORE_OK" in out.stdout
    check(ok, "Python (MooncakeStoreBackend) restored the C++ TP4xPP2xDP2 snapshot into PP2xEP4, every byte: "
          f"{out.stdout.strip()[-300:]}{'' if ok else chr(10) + out.stderr[-1500:]}")
    out = subprocess.run([py, os.path.join(here, "store_py_role.py"), run.master.address, "snapshot", run.ns],
                         capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    key = [x.split(" ", 1)[1] for x in out.stdout.splitlines() if x.startswith("PY_MANIFEST ")]
    ok = out.returncode == 0 and len(key) == 1
    check(ok, f"Python TP2xPP2xEP2xDP2 snapshot: {out.stdout.strip()[-300:]}"
              f"{'' if ok else chr(10) + out.stderr[-1500:]}")
    restore(run, key[0], 2)
    check(True, "C++ server restored the Python snapshot into TP2xEP2, every byte")
    lst = last(run.role("revisions", run.ns), "revisions")
    got = sorted((r["revision"], r["manifest"]) for r in lst["revisions"])
    check(got == sorted([("rev-x", t["manifest"]), ("rev-py", key[0])]),
          "C++ Store::revisions lists the C++ and the Python revision (each language's commit wrote its index entry)")


def case_store_and_te(run: Run) -> None:
    role, t = with_snapshot(run, "MWS_STORE_TE_ROLE", "rev-te")
    err = os.path.join(run.dir, "store_te_role.stderr")
    with open(err, "w") as e:
        p = subprocess.run([role, run.master.address, t["manifest"], "2", str(free_port())], stdout=subprocess.PIPE,
                           stderr=e, text=True, env=run.env(), timeout=TIMEOUT_S)
    lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        with open(err) as f:
            raise AssertionError(f"store_te_role exited {p.returncode}: {p.stdout}\n{f.read()[-3000:]}")
    r = last(lines, "store_te")
    check(r["store_self_test"] == 0 and r["te_self_check"] == 0,
          "one process: store adapter self_test and TE adapter self_check both 0")
    check(r["restored"] > 0 and r["restore_verified"] > 0,
          f"restored {r['restored']} bytes from Mooncake Store into TP2xEP2, every byte ({r['restore_verified']})")
    check(r["pushed"] > 0 and r["push_verified"] > 0 and r["te_batches"] > 0,
          f"then pushed {r['pushed']} bytes live through its own TransferEngine into TP4 "
          f"({r['te_batches']} native batches), every byte ({r['push_verified']})")


def main() -> int:
    case = sys.argv[1]
    if not ROLE:
        print("MWS_STORE_ROLE not set", file=sys.stderr)
        return 2
    run = Run()
    try:
        print(f"{case}: master {run.master.address}, namespace {run.ns}, logs {run.dir}", flush=True)
        globals()[f"case_{case}"](run)
    finally:
        run.close()
    print(f"mooncake {case}: OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
