"""One client of test/gpu/soak/soak.py: a CUDA process with PyTorch or CuPy that follows commands, one a
line on stdin, and answers each with one JSON line on stdout.

  client.py torch|cupy
    init          create the CUDA context (the shim connects here)   -> {"ok": true} or {"ok": false, "error"}
    alloc MIB     allocate MIB MiB and keep it                        -> {"ok": bool}  (out of memory: false)
    free          drop everything held and give it back to the driver -> {"ok": true}
    compute N     N matrix products of 2048x2048 on the GPU, then wait -> {"ok": bool}
    exit          -> {"ok": true}, then the process ends
"""
import json
import sys

MIB = 1 << 20


def oom(e):
    return "out of memory" in str(e).lower() or type(e).__name__ in ("OutOfMemoryError", "OutOfMemoryError")


class Torch:
    def __init__(self):
        import torch
        self.t = torch
        self.held = []

    def init(self):
        self.t.cuda.init()
        self.t.empty(1, device="cuda")

    def alloc(self, mib):
        self.held.append(self.t.empty(mib * MIB, dtype=self.t.uint8, device="cuda"))

    def free(self):
        self.held.clear()
        self.t.cuda.empty_cache()

    def compute(self, n):
        a = self.t.randn(2048, 2048, device="cuda")
        for _ in range(n):
            a = (a @ a).tanh()
        self.t.cuda.synchronize()


class Cupy:
    def __init__(self):
        import cupy
        self.cp = cupy
        self.held = []

    def init(self):
        self.cp.cuda.runtime.getDeviceCount()
        self.cp.zeros(1)

    def alloc(self, mib):
        self.held.append(self.cp.empty(mib * MIB, dtype=self.cp.uint8))

    def free(self):
        self.held.clear()
        self.cp.get_default_memory_pool().free_all_blocks()

    def compute(self, n):
        a = self.cp.random.standard_normal((2048, 2048), dtype=self.cp.float32)
        for _ in range(n):
            a = self.cp.tanh(a @ a)
        self.cp.cuda.Device().synchronize()


def main():
    c = Torch() if sys.argv[1] == "torch" else Cupy()
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        ans = {"ok": True}
        try:
            if cmd[0] == "init":
                c.init()
            elif cmd[0] == "alloc":
                c.alloc(int(cmd[1]))
            elif cmd[0] == "free":
                c.free()
            elif cmd[0] == "compute":
                c.compute(int(cmd[1]))
            elif cmd[0] == "exit":
                print(json.dumps(ans), flush=True)
                return
        except Exception as e:  # the driver's refusal is an answer, never the end of the process
            ans = {"ok": False, "oom": oom(e), "error": str(e).splitlines()[0][:200] if str(e) else type(e).__name__}
        print(json.dumps(ans), flush=True)


if __name__ == "__main__":
    main()
