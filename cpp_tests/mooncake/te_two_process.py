"""Two (or more) processes on the REAL Mooncake Transfer Engine (loopback TCP,
P2PHANDSHAKE): C++ te_role processes (the adapter mooncake_weight_store::mooncake_te
over each process's own mooncake::TransferEngine) and, for the cross-language case,
Python processes on the Mooncake wheel (py_role.py, te_backend.py). Only JSON lines
cross processes (serving_engine: examples/serving_engine.cpp, a server and a trainer
process that exchange files in a folder of this run). Every child is stopped by its
PID on every exit path.

    python3 te_two_process.py two_process | kill_and_recover | stale_and_forged | cross_language | serving_engine

Environment (set by ctest, cpp_tests/mooncake/CMakeLists.txt): MWS_TE_ROLE (the C++
role binary), MWS_SERVING_ENGINE (examples/serving_engine.cpp on the real engine),
MWS_MOONCAKE_PYTHON (a Python with the Mooncake wheel), MWS_LIBRARY and MWS_REPO (for
the Python package). Prints "mooncake <case>: OK" on success.
Standard library only.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT_S = 120
KEY = "6d77732d6e6f746966792d746573742d6b65792d3332627974657321"  # 28 bytes, hex
HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = {"layers": 2, "hidden": 256, "experts": 2}


class Child:
    """One role process: JSON lines in and out, bounded waits, stopped by PID."""

    def __init__(self, name: str, argv: list, logdir: str, env: dict | None = None, kind: str = "cpp") -> None:
        self.name = name
        self.kind = kind
        e = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1", GLOG_minloglevel="2")
        if env:
            e.update(env)
        self.err = open(os.path.join(logdir, f"{name}.stderr"), "w+")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, env=e)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.hello = self.read()
        assert self.hello.get("ready"), self.hello
        self.segment = self.hello["segment"]

    def _pump(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line)
        self.lines.put("")

    def read(self, timeout: float = TIMEOUT_S) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name}: no answer within {timeout} s; stderr:\n{self.tail()}")
        if not line:
            raise AssertionError(f"{self.name} exited (rc {self.proc.poll()}); stderr:\n{self.tail()}")
        try:
            msg = json.loads(line)
        except ValueError:
            raise AssertionError(f"{self.name}: not JSON: {line!r}")
        if "error" in msg:
            raise AssertionError(f"{self.name}: {msg['error']}\n{msg.get('trace', '')}\nstderr:\n{self.tail()}")
        return msg

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def call(self, op: str, **kw) -> dict:
        self.send(dict(kw, op=op))
        return self.read()

    def tail(self) -> str:
        self.err.flush()
        self.err.seek(0)
        return "".join(self.err.readlines()[-30:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "quit"})
                self.proc.wait(timeout=20)
            except Exception:
                pass
        terminate(self.proc)
        self.err.close()


def terminate(proc: subprocess.Popen) -> None:
    """SIGTERM by PID, then SIGKILL when it does not exit within 10 s."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class Run:
    """The children of one case, stopped on exit."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="mws-te-")
        self.children: list = []

    def cpp(self, name: str) -> Child:
        c = Child(name, [os.environ["MWS_TE_ROLE"]], self.tmp)
        self.children.append(c)
        return c

    def py(self, name: str) -> Child:
        py = os.environ.get("MWS_MOONCAKE_PYTHON") or sys.executable
        env = {"PYTHONPATH": os.path.join(os.environ["MWS_REPO"], "python")}
        c = Child(name, [py, os.path.join(HERE, "py_role.py")], self.tmp, env, kind="py")
        self.children.append(c)
        return c

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> None:
        for c in self.children:
            c.stop()


def check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)
    print(f"  ok: {what}", flush=True)


def setup(trainer: Child, server: Child, gen: int) -> dict:
    extra = {"trainer": {}, "server": {}}
    for child, role, other in ((trainer, "trainer", server), (server, "server", trainer)):
        if child.kind == "py":  # the Python role takes the model's placement from the C++ side
            extra[role]["placement"] = other.call("placement_for", role=role, generation=gen, **MODEL)["placement"]
    t = trainer.call("setup", role="trainer", generation=gen, **MODEL, **extra["trainer"])
    s = server.call("setup", role="server", generation=gen, **MODEL, **extra["server"])
    trainer.call("peer", placement=s["placement"], bindings=s["bindings"])
    server.call("peer", placement=t["placement"], bindings=t["bindings"])
    plan = server.call("plan")
    return {"plan": plan["plan"], "bytes": plan["bytes"], "regions": plan["regions"]}


def clean(state: dict, who: str) -> None:
    check(state["registered"] == 0 and state["pending"] == 0 and state["in_flight"] == 0
          and state["open_tickets"] == 0 and state["pins_held"] == 0 and state["pins_taken"] > 0,
          f"{who}: nothing left registered by the library, pinned, pending, in flight or ticketed "
          f"(registered {state['registered']}, pins held {state['pins_held']} of {state['pins_taken']} taken, "
          f"pending {state['pending']}, in flight {state['in_flight']}, tickets {state['open_tickets']})")


def all_good(verify: dict) -> bool:
    return all(v is None for v in verify.values())


def pull(server: Child, p: dict, tickets: bool, **kw) -> dict:
    server.call("reset")
    r = server.call("pull", plan=p["plan"], tickets=tickets, **kw)
    mode = "tickets" if tickets else "legacy batches"
    check(r["outcome"] == "ok", f"pull ({mode}{', split' if kw.get('split') else ''}): {r['reason'] or 'ok'}")
    check(r["bytes"] == p["bytes"] and all_good(r["verify"]),
          f"pull ({mode}): {r['bytes']} bytes, every target byte verified")
    clean(r, "server after pull")
    return r


def push(trainer: Child, server: Child, p: dict, tickets: bool, **kw) -> tuple:
    server.call("reset")
    r = trainer.call("push", plan=p["plan"], tickets=tickets, key=KEY, **kw)
    mode = "tickets" if tickets else "legacy batches"
    check(r["outcome"] == "ok", f"push ({mode}, notified): {r['reason'] or 'ok'}")
    check(r["bytes"] == p["bytes"], f"push moved {r['bytes']} bytes (plan: {p['bytes']})")
    clean(r, "trainer after push")
    a = server.call("accept", plan=p["plan"], key=KEY, timeout_ms=20000)
    kinds = {k: v["kind"] for k, v in a["outcomes"].items()}
    check(all(v == "updated" for v in kinds.values()),
          f"server accepted the generation through getNotifies: {kinds} ({a['messages']} messages)")
    check(all_good(a["verify"]) and not a["updated_but_wrong"], "every target byte verified after the push")
    return r, a


def case_two_process(run: Run) -> None:
    trainer, server = run.cpp("trainer"), run.cpp("server")
    check(server.call("self_check")["rc"] == 0, "adapter self-check on the real engine (headers match engine.so)")
    modes = [(False, True), (True, False), (True, True)]
    for gen, (pull_tickets, push_tickets) in zip((1, 2, 3), modes):
        print(f"generation {gen}", flush=True)
        p = setup(trainer, server, gen)
        r = pull(server, p, pull_tickets)
        c = r["counters"]
        check(c["staged_runs"] > 0 and c["staged_ranges"] > c["staged_runs"],
              f"column-split rows read as remote runs through the staging pool: {c['staged_ranges']} ranges in "
              f"{c['staged_runs']} requests ({r['engine_operations']} engine operations planned)")
        pull(server, p, pull_tickets, no_staging=True)
        push(trainer, server, p, push_tickets)
    # A plan over the per-peer queue limit: one executor batch per endpoint (max_batch_operations
    # far above 1024, no coalescing), split by the adapter into native batches of at most 1024.
    print("generation 4: over the per-peer queue limit", flush=True)
    p = setup(trainer, server, 4)
    for tickets in (True, False):
        r = pull(server, p, tickets, split=True)
        c = r["counters"]
        check(r["engine_operations"] > 1024 * 4 and c["largest_batch"] <= 1024 and c["native_batches"] > 4
              and c["submit_errors"] == 0 and c["peak_in_flight"] <= 1024,
              f"split ({'tickets' if tickets else 'legacy'}): {r['engine_operations']} operations in "
              f"{c['native_batches']} native batches, largest {c['largest_batch']}, peak in flight "
              f"{c['peak_in_flight']}, no submit error")
        r, _ = push(trainer, server, p, tickets, split=True)
        c = r["counters"]
        check(c["largest_batch"] <= 1024 and c["submit_errors"] == 0,
              f"split push: {c['native_batches']} native batches, largest {c['largest_batch']}")


def paused(child: Child) -> None:
    msg = child.read()
    assert msg.get("paused"), msg


def case_kill_and_recover(run: Run) -> None:
    trainer, server = run.cpp("trainer"), run.cpp("server")
    p = setup(trainer, server, 1)
    pull(server, p, True)
    # 1. The trainer killed mid-pull (between two batches of one call).
    print("trainer killed mid-pull", flush=True)
    p = setup(trainer, server, 2)
    server.call("reset")
    server.send({"op": "pull", "plan": p["plan"], "tickets": True, "pause": True})
    paused(server)
    trainer.kill()
    server.send({"op": "go"})
    r = server.read()
    check(r["outcome"] == "failed" and r["updated"] == [], f"the pull failed, no target reported updated: {r['reason']}")
    check(not all_good(r["verify"]), "(the targets' bytes are indeed not all there)")
    if r["pending"]:
        server.call("drain")
    clean(server.call("state"), "server after the failed pull")
    trainer = run.cpp("trainer-2")
    p = setup(trainer, server, 3)
    pull(server, p, True)
    push(trainer, server, p, True)
    # 2. The server killed mid-push.
    print("server killed mid-push", flush=True)
    p = setup(trainer, server, 4)
    trainer.send({"op": "push", "plan": p["plan"], "tickets": True, "key": KEY, "pause": True})
    paused(trainer)
    server.kill()
    trainer.send({"op": "go"})
    r = trainer.read()
    check(r["outcome"] == "failed", f"the push failed: {r['reason']}")
    if r["pending"]:
        trainer.call("drain")
    clean(trainer.call("state"), "trainer after the failed push")
    server = run.cpp("server-2")
    p = setup(trainer, server, 5)
    push(trainer, server, p, True)
    pull(server, p, False)
    # 3. The trainer killed mid-push, the server alive: it learns only what landed.
    print("trainer killed mid-push, server alive", flush=True)
    p = setup(trainer, server, 6)
    server.call("reset")
    trainer.send({"op": "push", "plan": p["plan"], "tickets": True, "key": KEY, "pause": True})
    paused(trainer)
    trainer.kill()
    a = server.call("accept", plan=p["plan"], key=KEY, timeout_ms=6000, until_quiet=True)
    kinds = {k: v["kind"] for k, v in a["outcomes"].items()}
    check(not a["updated_but_wrong"] and "torn" in kinds.values() and "updated" not in kinds.values(),
          f"no target reported updated whose bytes differ; outcomes {kinds}")
    trainer = run.cpp("trainer-3")
    p = setup(trainer, server, 7)
    push(trainer, server, p, True)


def case_stale_and_forged(run: Run) -> None:
    trainer, server = run.cpp("trainer"), run.cpp("server")
    p1 = setup(trainer, server, 1)
    server.call("bind", plan=p1["plan"], side="server")
    trainer.call("bind", plan=p1["plan"], side="trainer")
    push(trainer, server, p1, True)
    gen1 = trainer.call("sent")["messages"]
    # Both moved to generation 2: the plan bound for generation 1 is stale.
    p2 = setup(trainer, server, 2)
    r = server.call("pull", use_kept=True, tickets=True)
    check(r["status"] == "MWS_STALE_BINDING" and r["engine_calls_in_call"] == 0,
          f"stale generation refused before any TE call (pull): {r['reason']}")
    r = trainer.call("push", use_kept=True, tickets=True, key=KEY)
    check(r["status"] == "MWS_STALE_BINDING" and r["engine_calls_in_call"] == 0 and r["notifications"] == 0,
          f"stale generation refused before any TE call or notification (push): {r['reason']}")
    r = server.call("pull", plan=p2["plan"], tickets=True, stale="lease")
    check(r["status"] == "MWS_STALE_BINDING" and r["engine_calls_in_call"] == 0,
          f"stale lease refused before any TE call (pull): {r['reason']}")
    r = trainer.call("push", plan=p2["plan"], tickets=True, key=KEY, stale="lease")
    check(r["status"] == "MWS_STALE_BINDING" and r["engine_calls_in_call"] == 0 and r["notifications"] == 0,
          f"stale lease refused before any TE call or notification (push): {r['reason']}")
    # Generation 2 lands; then truncated, forged, replayed and stale (generation 1)
    # notifications arrive through TE: each refused, nothing changes.
    push(trainer, server, p2, True)
    f = trainer.call("forge", stale_messages=gen1)
    check(f["send_failures"] == 0, f"{f['sent']} altered notifications delivered through sendNotifyByName")
    a = server.call("accept", plan=p2["plan"], key=KEY, timeout_ms=5000, until_quiet=True)
    v = a["verdicts"]
    check(v.get("0", 0) == 0 and v.get("2", 0) > 0 and v.get("3", 0) > 0 and v.get("4", 0) > 0 and v.get("5", 0) > 0,
          f"refused: truncated {v.get('2', 0)}, forged {v.get('3', 0)}, replayed {v.get('4', 0)}, "
          f"stale {v.get('5', 0)}; accepted {v.get('0', 0)}")
    check(a["other_notifications"] == 1, "a foreign notification is left to the serving engine")
    kinds = {k: o["kind"] for k, o in a["outcomes"].items()}
    check(all(k == "updated" for k in kinds.values()) and all_good(a["verify"]),
          "the refused notifications changed nothing (still updated, bytes intact)")
    print("  refusal texts: " + "; ".join(sorted(set(x.split(" (")[0] for x in a["refusals"])))[:600])


def case_cross_language(run: Run) -> None:
    # A Python trainer (te_backend.py on the wheel) pushes into a C++ server's registered buffers.
    trainer, server = run.py("py-trainer"), run.cpp("cpp-server")
    for gen in (1, 2):
        p = setup(trainer, server, gen)
        server.call("reset")
        r = trainer.call("push", plan=p["plan"])
        check(r["outcome"] == "ok" and r["bytes"] == p["bytes"], f"Python trainer pushed generation {gen}: {r}")
        v = server.call("verify")["verify"]
        check(all_good(v), f"C++ server: every byte of generation {gen} verified")
    trainer.stop()
    server.stop()
    # A C++ trainer serves pulls by a Python server.
    trainer, server = run.cpp("cpp-trainer"), run.py("py-server")
    for gen in (1, 2):
        p = setup(trainer, server, gen)
        r = server.call("pull", plan=p["plan"])
        check(r["outcome"] == "ok" and r["bytes"] == p["bytes"] and all_good(r["verify"]),
              f"Python server pulled generation {gen} from the C++ trainer, every byte verified")


class Proc:
    """A process of examples/serving_engine.cpp (no JSON protocol: it exchanges files in
    a folder with its peer); output to files, stopped by PID."""

    def __init__(self, name: str, argv: list, logdir: str) -> None:
        self.name = name
        e = dict(os.environ, MC_TCP_BIND_ADDRESS="127.0.0.1", GLOG_minloglevel="2")
        self.out = open(os.path.join(logdir, f"{name}.stdout"), "w+")
        self.err = open(os.path.join(logdir, f"{name}.stderr"), "w+")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.out, stderr=self.err, text=True, env=e)

    def finish(self, deadline: float) -> list:
        try:
            rc = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not finish in time:\n{self.text(self.out)}{self.text(self.err)}")
        if rc != 0:
            raise AssertionError(f"{self.name} exited with {rc}:\n{self.text(self.out)}{self.text(self.err)}")
        return self.text(self.out).splitlines()

    @staticmethod
    def text(f) -> str:
        f.flush()
        f.seek(0)
        return "".join(f.readlines()[-40:])

    def stop(self) -> None:
        terminate(self.proc)
        self.out.close()
        self.err.close()


def case_serving_engine(run: Run) -> None:
    """examples/serving_engine.cpp on the real engine: a server and a trainer process,
    four generations pushed by prepared, notified, started, content-verified steps; a
    landing byte of generation 4 flipped at the server is caught as Torn, 5 repairs it."""
    exe = os.environ["MWS_SERVING_ENGINE"]
    folder = os.path.join(run.tmp, "exchange")
    os.mkdir(folder)
    args = ["--dir", folder, "--generations", "4", "--corrupt", "4"]
    server = Proc("server", [exe, "--role", "server"] + args, run.tmp)
    run.children.append(server)
    trainer = Proc("trainer", [exe, "--role", "trainer"] + args, run.tmp)
    run.children.append(trainer)
    deadline = time.monotonic() + TIMEOUT_S
    t_out = trainer.finish(deadline)
    s_out = server.finish(deadline)
    for line in s_out + t_out:
        print(line, flush=True)
    text = "\n".join(s_out)
    for g in (2, 3):
        check(f"generation {g}: server: Updated on 4 targets, content verified -> serving generation {g}" in text,
              f"generation {g}: Updated on every target, served after its bytes were checked")
    check("generation 4: fault injected" in text and "generation 4: server: TORN" in text
          and "generation 4: server: not flipped, still serving generation 3" in text,
          "generation 4: the flipped landing byte caught as Torn by the verifying acceptor; generation 3 still served")
    check("serving generation 5 (every served byte checked)" in text, "generation 5 repaired it: served")
    check(any("serving_engine: OK" in x for x in t_out), "the trainer's steps all reported their targets updated")


CASES = {"two_process": case_two_process, "kill_and_recover": case_kill_and_recover,
         "stale_and_forged": case_stale_and_forged, "cross_language": case_cross_language,
         "serving_engine": case_serving_engine}


def main() -> int:
    case = sys.argv[1]
    t0 = time.monotonic()
    with Run() as run:
        CASES[case](run)
    print(f"mooncake {case}: OK ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
