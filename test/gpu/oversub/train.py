"""PyTorch job for the oversubscription tests and benchmarks on a GPU.

Trains the deterministic model of test/gpu/shim/workload.py and keeps a
"ballast" of device memory (a uint8 tensor) that it XORs every step, so the
process's working set is as large as asked and every byte of it is live:

  python3 train.py --steps 400 --ballast-gb 3 [--sleep-every 50 --sleep-s 0.5]

Prints one JSON line: sha256 over the final parameters (must equal a run
without the shim, bit for bit), ballast_ok (every ballast byte has the value
the XORs leave), seconds, the timed loop (after --warmup steps and, with
--barrier, once every process of a pair has warmed up: loop_start, loop_end as
wall-clock seconds, loop_seconds) and the allocator setting in effect.
"""
import argparse
import json
import os
import sys
import time

T_START = time.time()  # before torch's import: the start-up phases are reported (t_start, t_import, t_ready)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shim"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from workload import data, deterministic, digest, model  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--ballast-gb", type=float, default=0.0)
    p.add_argument("--sleep-every", type=int, default=0, help="CPU phase every N steps (mixed job)")
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=0, help="steps (of --steps) before the timed loop")
    p.add_argument("--barrier", default="", help="directory: after the warm-up, wait until --barrier-n processes got there")
    p.add_argument("--barrier-n", type=int, default=2)
    a = p.parse_args()
    deterministic()
    t0 = time.time()
    nb = int(a.ballast_gb * (1 << 30))
    ballast = torch.full((nb,), 0x3C, dtype=torch.uint8, device="cuda") if nb else None
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    x, y = data(16)
    x, y = x.cuda(), y.cuda()
    loss = None
    ls = None
    t_ready = time.time()  # ballast, model and data made: the loop's first step comes next
    for i in range(a.steps):
        if i == a.warmup:
            torch.cuda.synchronize()
            if a.barrier:
                open(os.path.join(a.barrier, str(os.getpid())), "w").close()
                deadline = time.time() + 300
                while len(os.listdir(a.barrier)) < a.barrier_n and time.time() < deadline:
                    time.sleep(0.001)
            ls = time.time()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(m(x[i % 16]), y[i % 16])
        loss.backward()
        opt.step()
        if ballast is not None:
            ballast.bitwise_xor_(0x5A)
        if a.sleep_every and (i + 1) % a.sleep_every == 0:
            torch.cuda.synchronize()
            time.sleep(a.sleep_s)
    torch.cuda.synchronize()
    le = time.time()
    ok = True
    if ballast is not None:
        want = 0x3C ^ (0x5A if a.steps % 2 else 0)
        step = 64 << 20  # in slices: a whole-tensor comparison would need as much memory again
        for i in range(0, nb, step):
            ok = ok and bool((ballast[i:i + step] == want).all().item())
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"sha256": digest(m.parameters()), "loss": float(loss), "ballast_ok": ok,
                      "seconds": round(time.time() - t0, 3), "mem_total": total,
                      "loop_start": ls, "loop_end": le, "loop_seconds": round(le - ls, 4) if ls else None,
                      "timed_steps": a.steps - a.warmup,
                      "t_start": T_START, "t_import": t0, "t_ready": t_ready,
                      "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                      "shim": bool(os.environ.get("LD_PRELOAD"))}), flush=True)


if __name__ == "__main__":
    main()
