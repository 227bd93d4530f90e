"""Opportunistic side of the QoS benchmark: ResNet-50 training on fixed random data until told to stop.

  python3 train.py --out steps.json [--batch 128] [--size 224] [--fp32] [--ballast-gb 0] [--digest-steps 20]

Two trainers of different kernel lengths (bench.sh's TRAINER): the default, batch 128 at 224 px under
fp16 autocast (long convolutions), and batch 64 at 160 px in fp32 (--batch 64 --size 160 --fp32: kernels
a few times shorter, many of them launch-bound).

It trains until SIGTERM (or --max-seconds), then writes --out: the wall-clock end time of every step
(the benchmark counts the steps inside each production phase) and a digest of the losses of the first
--digest-steps steps, which must equal the solo run's bit for bit (deterministic kernels, fixed data).
--ballast-gb keeps that much more device memory live (touched every step), to size the working set for
the oversubscribed configuration.
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import deterministic, resnet50  # noqa: E402

stop = False


def on_term(*_):
    global stop
    stop = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224, help="image side in pixels")
    p.add_argument("--fp32", action="store_true", help="no fp16 autocast")
    p.add_argument("--ballast-gb", type=float, default=0.0)
    p.add_argument("--digest-steps", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=900)
    p.add_argument("--ready", default="", help="file written once the first steps ran")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    deterministic()
    torch.use_deterministic_algorithms(True)
    m, source = resnet50()
    m = m.cuda().train()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=not a.fp32)  # fp32: scale() and step() pass through
    g = torch.Generator().manual_seed(2)
    x = torch.randn(a.batch, 3, a.size, a.size, generator=g).cuda()
    y = torch.randint(0, 1000, (a.batch,), generator=g).cuda()
    nb = int(a.ballast_gb * (1 << 30))
    ballast = torch.zeros(nb, dtype=torch.uint8, device="cuda") if nb else None
    lossf = torch.nn.CrossEntropyLoss()
    h = hashlib.sha256()
    ends = []
    t0 = time.time()
    step = 0
    while not stop and time.time() - t0 < a.max_seconds:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=not a.fp32):
            loss = lossf(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if ballast is not None:
            ballast.add_(1)
        v = loss.item()  # one host sync a step, as training loops that log their loss do
        step += 1
        if step <= a.digest_steps:
            h.update(repr(v).encode())
        ends.append(time.time())
        if step == 3 and a.ready:
            open(a.ready, "w").close()
    with open(a.out, "w") as f:
        json.dump({"model_source": source, "batch": a.batch, "size": a.size, "fp32": a.fp32, "steps": step, "ends": ends,
                   "loss_digest": h.hexdigest()[:16] if step >= a.digest_steps else "",
                   "memory_reserved": torch.cuda.memory_reserved()}, f)


if __name__ == "__main__":
    main()
