"""Deterministic PyTorch training / inference loops for the shim's GPU tests.

Prints one JSON line: the mode, a sha256 over the final parameters (train) or
all outputs (infer), and timings. Run with and without libgpushare.so: the
digests must be equal bit for bit.

  python3 workload.py train --steps 200
  python3 workload.py infer --steps 200        # eager forward passes + CUDA-graph replays
"""
import argparse
import hashlib
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def deterministic():
    """Same results bit for bit on every run: no autotuning, no TF32, deterministic kernels."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        # AvgPool2d, not AdaptiveAvgPool2d: the latter's CUDA backward is not deterministic.
        nn.AvgPool2d(8), nn.Flatten(), nn.Linear(64 * 16, 256), nn.ReLU(), nn.Linear(256, 10),
    ).cuda()


def data(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 64, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n, 64), generator=g)
    return x, y


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(steps):
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    x, y = data(16)
    x, y = x.cuda(), y.cuda()
    loss = None
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(m(x[i % 16]), y[i % 16])
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return digest(m.parameters()), float(loss)


def infer(steps):
    m = model().eval()
    x, _ = data(16)
    x = x.cuda()
    outs = []
    with torch.no_grad():
        for i in range(steps // 2):
            outs.append(m(x[i % 16]).sum(0))
        # CUDA graph: capture once (stream capture under the shim), replay the rest.
        static_in = x[0].clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = m(static_in)
        for i in range(steps - steps // 2):
            static_in.copy_(x[i % 16])
            g.replay()
            outs.append(static_out.sum(0).clone())
    torch.cuda.synchronize()
    return digest(outs), float(torch.stack(outs).sum())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "infer"])
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    deterministic()
    t0 = time.time()
    d, v = train(a.steps) if a.mode == "train" else infer(a.steps)
    print(json.dumps({"mode": a.mode, "sha256": d, "value": v, "seconds": round(time.time() - t0, 3),
                      "shim": bool(os.environ.get("LD_PRELOAD"))}), flush=True)


if __name__ == "__main__":
    main()
