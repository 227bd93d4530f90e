"""The GPU soak's driver (test/gpu/soak/run.sh): real CUDA clients through the standalone scheduler with
one claim, a seeded random mix of allocations, frees, compute, exits and SIGKILLs of clients and of the
scheduler, and invariants 1, 2, 5 and 6 of docs/reliability.md ("Soak") checked against NVML after every
step. A violation prints the seed and the step; exit status 1 if any.

  soak.py --seed S --duration SECONDS --scheduler BIN --shim LIB --uuid UUID --claim BYTES --reserve BYTES
          [--kinds torch,cupy] [--stub BUILD]

--stub BUILD runs shim/tests/soak_client over the stub driver of BUILD instead of PyTorch and CuPy, and
reads NVML's per-process figure from the stub's holdings files: the driver itself checked without a GPU.
"""
import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

MIB = 1 << 20
# The invariants' bounds (docs/reliability.md, "Soak").
CONNECT_BOUND = 10.0  # s: a process with a context is a client of the scheduler and in its ledger
SETTLE_BOUND = 15.0  # s: every client gone, NVML and the scheduler's accounts are back to zero
REPLY_TIMEOUT = 120.0  # s: a client that does not answer a command is hung


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.work = tempfile.mkdtemp(prefix="gpusoak")
        self.hold = os.path.join(self.work, "hold")
        os.mkdir(self.hold)
        self.port = 20000 + a.seed % 20000
        self.sched = None
        self.clients = []  # dicts: proc, kind, since (when its bounds start), ctx
        self.step = 0
        self.violations = []
        self.reset_at = time.monotonic()
        self.counts = {}

    def log(self, msg):
        print(f"{time.strftime('%H:%M:%S')} seed={self.a.seed} step={self.step} {msg}", flush=True)

    def violate(self, inv, what):
        self.violations.append((self.step, inv, what))
        self.log(f"VIOLATION invariant={inv}: {what}")

    # ---- the scheduler ----
    def start_sched(self):
        self.sched = subprocess.Popen(
            [self.a.scheduler, "--socket-dir", self.work, "--gpu", f"{self.a.uuid}:200ms:100ms",
             "--claim-memory", str(self.a.claim), "--context-reserve", str(self.a.reserve),
             "--metrics-addr", f"127.0.0.1:{self.port}", "--rebuild-window", "1s", "-v", "1"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.work, "sched.log"), "a"))
        sock = os.path.join(self.work, self.a.uuid + ".sock")
        for _ in range(100):
            if self.metrics() is not None and os.path.exists(sock):
                break
            time.sleep(0.1)
        self.reset_at = time.monotonic()

    def kill_sched(self):
        self.sched.send_signal(signal.SIGKILL)
        self.sched.wait()

    def metrics(self):
        """The scheduler's series: {(name, frozenset(labels)): value}; None when it does not answer."""
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2).read().decode()
        except OSError:
            return None
        out = {}
        for line in body.splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name, _, labels = series.partition("{")
            kv = frozenset(tuple(p.split("=", 1)) for p in labels.rstrip("}").replace('"', "").split(",") if "=" in p)
            out[(name, kv)] = float(value)
        return out

    # ---- NVML ----
    def nvml(self):
        """Device memory by pid, as NVML counts it (contexts included)."""
        if self.a.stub:
            out = {}
            for f in os.listdir(self.hold):
                if f.startswith("."):
                    continue
                try:
                    with open(os.path.join(self.hold, f)) as h:
                        out[int(f)] = sum(int(l.split()[1]) for l in h if l.split())
                except (OSError, ValueError):
                    pass
            # a process that ended holds nothing: NVML lists only live ones
            return {p: b for p, b in out.items() if os.path.exists(f"/proc/{p}")}
        r = subprocess.run(["nvidia-smi", "-i", self.a.uuid, "--query-compute-apps=pid,used_memory",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
        out = {}
        for line in r.stdout.splitlines():
            p = [x.strip() for x in line.split(",")]
            if len(p) == 2 and p[1].isdigit():
                out[int(p[0])] = int(p[1]) * MIB
        return out

    # ---- clients ----
    def spawn(self):
        kind = self.rng.choice(self.a.kinds)
        env = dict(os.environ, GPUSHARE_SOCKET=os.path.join(self.work, self.a.uuid + ".sock"),
                   GPUSHARE_GPU_UUID=self.a.uuid, GPUSHARE_MEMORY_LIMIT_BYTES=str(self.a.claim),
                   LD_PRELOAD=self.a.shim)
        if self.a.stub:
            env.update(LD_LIBRARY_PATH=os.path.join(self.a.stub, "stub"), GPUSHARE_STUB_HOLD_DIR=self.hold,
                       GPUSHARE_STUB_CTX_BYTES=str(300 * MIB), GPUSHARE_STUB_LAUNCH_US="2000")
            argv = [os.path.join(self.a.stub, "tests", "soak_client")]
        else:
            argv = [sys.executable, os.path.join(os.path.dirname(__file__), "client.py"), kind]
        p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(os.path.join(self.work, "clients.log"), "a"), text=True, bufsize=1)
        c = {"proc": p, "kind": kind, "since": time.monotonic(), "ctx": False}
        self.clients.append(c)
        self.log(f"spawn {kind} pid {p.pid}")
        ok = self.do(c, "init")
        c["ctx"] = ok
        c["since"] = time.monotonic()

    def do(self, c, cmd):
        """Sends cmd, returns whether it succeeded; a client that does not answer is a violation."""
        words = cmd.split()
        if self.a.stub:  # soak_client speaks per device, in bytes
            verb = {"init": "ctx", "compute": "launch"}.get(words[0], words[0])
            args = [str(int(words[1]) * MIB)] if words[0] == "alloc" else words[1:]
            words = [verb] + ([] if verb == "exit" else ["0"] + args)
        p = c["proc"]
        try:
            p.stdin.write(" ".join(words) + "\n")
            p.stdin.flush()
        except OSError:
            self.violate(0, f"pid {p.pid} ended before {cmd!r}")
            return False
        ready, _, _ = select.select([p.stdout], [], [], REPLY_TIMEOUT)
        line = p.stdout.readline() if ready else ""
        if not line:
            self.violate(0, f"pid {p.pid} gave no answer to {cmd!r} within {REPLY_TIMEOUT:.0f} s")
            return False
        if self.a.stub:
            ok = line.strip().endswith("r=0") or line.startswith(("free", "exit"))
        else:
            ok = json.loads(line).get("ok", False)
        self.log(f"pid {p.pid} {cmd} -> {line.strip()}")
        return ok

    def remove(self, c):
        self.clients.remove(c)

    # ---- one step ----
    def act(self):
        self.step += 1
        w = self.rng.randrange(100)
        pick = self.rng.choice(self.clients) if self.clients else None
        mib, n = self.rng.choice([256, 512, 1024, 2048]), self.rng.randrange(5, 60)
        if pick is None or (w < 15 and len(self.clients) < 4):
            self.spawn()
            kind = "spawn"
        elif w < 45:
            self.do(pick, f"alloc {mib}")
            kind = "alloc"
        elif w < 60:
            self.do(pick, "free")
            kind = "free"
        elif w < 85:
            self.do(pick, f"compute {n}")
            kind = "compute"
        elif w < 92:
            self.log(f"SIGKILL pid {pick['proc'].pid}")
            pick["proc"].kill()
            pick["proc"].wait()
            self.remove(pick)
            kind = "kill-client"
        elif w < 96:
            self.do(pick, "exit")
            pick["proc"].wait()
            self.remove(pick)
            kind = "exit"
        else:
            self.log("SIGKILL the scheduler, start it again")
            self.kill_sched()
            self.start_sched()
            kind = "kill-scheduler"
        self.counts[kind] = self.counts.get(kind, 0) + 1

    # ---- the invariants ----
    def check(self):
        now, used, m = time.monotonic(), self.nvml(), self.metrics()
        ours = {c["proc"].pid for c in self.clients}
        total = sum(b for p, b in used.items() if p in ours)
        # 2 (and 5: with one claim the guard evicts exactly when the group is over it)
        if total > self.a.claim:
            self.violate(2, f"NVML: the claim's processes hold {total} bytes, the claim {self.a.claim}"
                            f" ({ {p: b for p, b in used.items() if p in ours} })")
        if m is None:
            self.violate(0, "the scheduler's metrics do not answer")
            return
        # 1: a process NVML lists with a context is a client of the scheduler and in the claim's ledger
        clients = {int(dict(k)["pid"]) for (name, k) in m if name == "gpusharing_scheduler_client_launch_bound"}
        ledger = sum(v for (name, k), v in m.items() if name == "gpusharing_scheduler_ledger_processes")
        settled = [c for c in self.clients if c["ctx"] and c["proc"].pid in used
                   and now - max(c["since"], self.reset_at) > CONNECT_BOUND]
        for c in settled:
            if c["proc"].pid not in clients:
                self.violate(1, f"pid {c['proc'].pid} holds a context (NVML) and is not the scheduler's client"
                                f" {now - max(c['since'], self.reset_at):.1f} s on")
        if ledger < len(settled):
            self.violate(1, f"the claim's ledger counts {ledger:.0f} processes, {len(settled)} hold contexts")

    def settle(self):
        """6: every client gone: NVML lists none of them, the scheduler has no client and its ledger is zero."""
        deadline, left = time.monotonic() + SETTLE_BOUND, None
        while time.monotonic() < deadline:
            m = self.metrics() or {}
            left = [f"NVML pid {p}" for p in self.nvml() if p in self.gone]
            left += [f"{name}{dict(k)}={v:g}" for (name, k), v in m.items()
                     if name in ("gpusharing_scheduler_clients", "gpusharing_scheduler_ledger_granted_bytes",
                                 "gpusharing_scheduler_ledger_processes") and v != 0]
            if not left:
                return
            time.sleep(0.5)
        self.violate(6, "every client gone, still: " + "; ".join(left))

    def run(self):
        self.gone = set()
        self.start_sched()
        end = time.monotonic() + self.a.duration
        while time.monotonic() < end:
            before = {c["proc"].pid for c in self.clients}
            self.act()
            self.gone |= before - {c["proc"].pid for c in self.clients}
            self.check()
            if not self.clients and self.step > 1:
                self.settle()
        for c in list(self.clients):
            self.gone.add(c["proc"].pid)
            c["proc"].kill()
            c["proc"].wait()
            self.remove(c)
        self.step += 1
        self.settle()
        self.kill_sched()
        self.log(f"done: {self.step} steps in {self.a.duration:.0f} s, {len(self.violations)} violations; "
                 f"steps by kind {json.dumps(self.counts, sort_keys=True)}")
        for s, inv, what in self.violations:
            print(f"VIOLATION seed={self.a.seed} step={s} invariant={inv}: {what}")
        return 1 if self.violations else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--scheduler", required=True)
    ap.add_argument("--shim", required=True)
    ap.add_argument("--uuid", required=True)
    ap.add_argument("--claim", type=int, default=8 << 30)
    ap.add_argument("--reserve", type=int, default=768 << 20)
    ap.add_argument("--kinds", default="torch,cupy")
    ap.add_argument("--stub", default="")
    a = ap.parse_args()
    a.kinds = a.kinds.split(",")
    sys.exit(Soak(a).run())


if __name__ == "__main__":
    main()
