"""One PyTorch process on a sized claim, for the sized scenario of test/gpu/stack (stackcheck/sized.go).

It prints one JSON line per event on stdout, each with "t" (time.time() when it happened), and takes
commands on stdin, one per line:
  (gated)    with the argument "gated", it reads one line from stdin before its first CUDA call, so the
             caller can place it in its pod before its CUDA context exists
  (start)    {"event": "ready", "pid", "total", "free", "sms"}: torch.cuda.mem_get_info() and the SMs
             this process may use (multi_processor_count: under MPS it shows the client's active thread
             percentage, as test/gpu/cap/mps.sh measured)
  (refused)  where its CUDA context is refused with out of memory (a claim's ledger with no room for one
             more process): {"event": "refused", "pid", "error"}; it then touches CUDA no more and
             waits for exit
  (always)   a 1024x1024 float64 matmul loop, each result compared with the CPU's; once a second
             {"event": "progress", "steps", "bad"}
  fill MAX   allocate 1 GiB tensors until torch.OutOfMemoryError, at most MAX GiB (the GPU is shared:
             a limit that does not hold must not take all of it), then free them:
             {"event": "filled", "gib", "oom", "error", "after_ok"}; after_ok: the process still
             computes correctly after the error
  hold GIB   allocate GIB, touch it and keep it: {"event": "held", "gib"}, t when it is held
  fillall    allocate all mem_get_info offers, halving the piece from 1 GiB down to 2 MiB (the caching
             allocator's grain) as it runs out, touch and keep it: {"event": "full", "bytes", "free",
             "total", "error"}; free is what mem_get_info offers after
  release    free what fillall kept: {"event": "released"}
  exit       {"event": "done", "steps", "bad"}, then exit 0 (also when stdin closes)
"""
import ctypes
import json
import os
import queue
import sys
import threading
import time

import torch

GIB = 1 << 30
# Three of these run at once beside the control plane: the CPU check of each result needs few threads.
torch.set_num_threads(2)


def say(**kw):
    kw["t"] = time.time()
    print(json.dumps(kw), flush=True)


if sys.argv[1:] == ["gated"]:
    sys.stdin.readline()
try:
    free, total = torch.cuda.mem_get_info()  # the first CUDA call: creates the primary context
except RuntimeError as e:
    # torch raises OutOfMemoryError from its allocator, a plain RuntimeError for a refused context.
    if not isinstance(e, torch.OutOfMemoryError) and "out of memory" not in str(e):
        raise
    say(event="refused", pid=os.getpid(), error=str(e).splitlines()[0][:240])
    for line in sys.stdin:
        if line.split() == ["exit"]:
            break
    say(event="done", steps=0, bad=0)
    sys.exit(0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
a = torch.randn(1024, 1024, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
want = a @ a  # on the CPU
x = a.cuda()


def correct():
    return torch.allclose((x @ x).cpu(), want, rtol=1e-9, atol=1e-9)


steps, bad = 1, 0 if correct() else 1
say(event="ready", pid=os.getpid(), total=total, free=free, sms=sms)

commands = queue.Queue()


def read_commands():
    for line in sys.stdin:
        if line.split():
            commands.put(line.split())
    commands.put(["exit"])


threading.Thread(target=read_commands, daemon=True).start()


def fill(most):
    held, oom, error = [], False, ""
    try:
        while len(held) < most:
            held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as e:
        oom, error = True, str(e).splitlines()[0][:240]
    except RuntimeError as e:  # any other error is no clean out-of-memory
        error = "not an out-of-memory error: " + str(e).splitlines()[0][:240]
    got = len(held)
    held.clear()
    torch.cuda.empty_cache()
    say(event="filled", gib=got, oom=oom, error=error, after_ok=bool(correct()))


def fill_tail():
    """What the caching allocator cannot hand out (it serves 1-10 MiB requests from 20 MiB segments), taken
    through the driver API on the same context, so fillall leaves nothing of what mem_get_info offers."""
    cu = ctypes.CDLL("libcuda.so.1")
    while True:
        free, _ = torch.cuda.mem_get_info()
        piece = free
        while piece >= 1 << 20:
            ptr = ctypes.c_uint64()
            if cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(piece)) == 0:
                raw.append(ptr.value)
                break
            piece //= 2
        else:
            return


def fill_all():
    piece, error = GIB, ""
    while True:
        free, _ = torch.cuda.mem_get_info()
        while piece > 2 << 20 and piece > free:
            piece //= 2
        if piece > free:
            break
        try:
            t = torch.empty(piece, dtype=torch.uint8, device="cuda")
            t.fill_(1)
            full.append(t)
        except torch.OutOfMemoryError as e:
            if piece <= 2 << 20:
                error = str(e).splitlines()[0][:240]
                break
            piece //= 2
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    fill_tail()
    free, total = torch.cuda.mem_get_info()
    say(event="full", bytes=sum(t.numel() for t in full) + before - free, free=free, total=total, error=error)


full = []
raw = []  # fill_tail's driver allocations
kept = []
last = 0.0
while True:
    try:
        cmd = commands.get_nowait()
    except queue.Empty:
        cmd = None
    if cmd and cmd[0] == "fill":
        fill(int(cmd[1]))
    elif cmd and cmd[0] == "hold":
        kept.append(torch.ones(int(float(cmd[1]) * GIB), dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        say(event="held", gib=float(cmd[1]))
    elif cmd and cmd[0] == "fillall":
        fill_all()
    elif cmd and cmd[0] == "release":
        full.clear()
        cu = ctypes.CDLL("libcuda.so.1")
        for p in raw:
            cu.cuMemFree_v2(ctypes.c_uint64(p))
        raw.clear()
        torch.cuda.empty_cache()
        say(event="released")
    elif cmd and cmd[0] == "exit":
        say(event="done", steps=steps, bad=bad)
        sys.exit(0)
    if full or raw:
        # Holding all its claim: a matmul's output and cuBLAS's workspace would find no memory.
        time.sleep(0.01)
        continue
    if not correct():
        bad += 1
    steps += 1
    if time.time() - last >= 1:
        last = time.time()
        say(event="progress", steps=steps, bad=bad)
