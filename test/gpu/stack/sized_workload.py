"""One PyTorch process on a sized claim, for the sized scenario of test/gpu/stack (stackcheck/sized.go).

It prints one JSON line per event on stdout, each with "t" (time.time() when it happened), and takes
commands on stdin, one per line:
  (start)    {"event": "ready", "pid", "total", "free", "sms"}: torch.cuda.mem_get_info() and the SMs
             this process may use (multi_processor_count: under MPS it shows the client's active thread
             percentage, as test/gpu/cap/mps.sh measured)
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


free, total = torch.cuda.mem_get_info()
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
    free, total = torch.cuda.mem_get_info()
    say(event="full", bytes=sum(t.numel() for t in full), free=free, total=total, error=error)


full = []
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
        torch.cuda.empty_cache()
        say(event="released")
    elif cmd and cmd[0] == "exit":
        say(event="done", steps=steps, bad=bad)
        sys.exit(0)
    if not correct():
        bad += 1
    steps += 1
    if time.time() - last >= 1:
        last = time.time()
        say(event="progress", steps=steps, bad=bad)
