"""Production side of the QoS benchmark: an inference server fed by open-loop Poisson arrivals.

  python3 serve.py --calibrate                       # solo service time of each model (JSON line)
  python3 serve.py --service resnet50=7.9,bert=5.1 --phases resnet50:0.3:0,bert:0.7:1 --seconds 6

Each phase is model:load:rep. Its arrivals are Poisson at rate = load / service time, from a seed of
(model, load, rep) only, so every configuration of a run sees the same arrival times. One server thread
answers them in order (a request that arrives while another runs queues); each model's forward pass is
a CUDA graph replayed per request, as inference servers run small batches, and resnet50-eager is the same
ResNet-50 run as plain eager PyTorch (one launch per operation, the GPU idle between kernels while
Python launches the next: production that is launch-bound). A request's latency is
from its arrival to its result being on the host: queueing included, as a client sees it. Each phase
prints one JSON line: p50, p99, mean, the requests, an output digest (the same fixed inputs every
request, so the digest must equal the alone run's bit for bit where the kernels are the same) and
gpu_busy: the fraction of the phase production's GPU work took, from CUDA events recorded around each
request's work (the graph's replay and the result's conversion). Alone, that is the GPU time production
itself needs (for resnet50-eager it is the request's whole span, the GPU's gaps between its kernels
included, so its idle share is only the time between requests); 1 - gpu_busy is the idle share it leaves, the most an opportunistic process can have of a
GPU that runs one context at a time (report.py). Beside a trainer the events also count the time the
request's work waited for the trainer's kernels, so only the alone figure is that share.

With --ready FILE the server writes FILE once its models are built and warm, then waits for FILE.go, so
the trainer's start-up is not inside any phase.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import deterministic, inference_model  # noqa: E402

BATCH = {"resnet50": 8, "bert": 8, "resnet50-eager": 8}


class Served:
    """One model served as inference servers do it: the forward pass captured once as a CUDA graph and
    replayed per request, so a request's time is the GPU's, not Python's launch overhead."""

    def __init__(self, m, x):
        self.m, self.x = m, x
        self.e0 = torch.cuda.Event(enable_timing=True)
        self.e1 = torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    m(x)
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.y = m(x)

    def __call__(self):
        self.e0.record()
        self.graph.replay()
        y = self.y.float()
        self.e1.record()
        return y.cpu()  # the copy to the host waits for the result, and for e1

    def gpu_ms(self):
        """The GPU time of the last call's work (its events are complete once its result is on the host)."""
        return self.e0.elapsed_time(self.e1)


class Eager(Served):
    """One model served eagerly: a forward pass of one launch per operation per request, no graph."""

    def __init__(self, m, x):
        self.m, self.x = m, x
        self.e0 = torch.cuda.Event(enable_timing=True)
        self.e1 = torch.cuda.Event(enable_timing=True)

    def __call__(self):
        self.e0.record()
        with torch.no_grad():
            y = self.m(self.x).float()
        self.e1.record()
        return y.cpu()


def run_once(served):
    return served()


def calibrate(models, n=60):
    out = {}
    for name, served in models.items():
        for _ in range(20):
            run_once(served)
        t0 = time.perf_counter()
        for _ in range(n):
            run_once(served)
        out[name] = (time.perf_counter() - t0) / n * 1000.0
    return out


def arrivals(model, load, rep, service_ms, seconds):
    rate = load / (service_ms / 1000.0)
    rng = random.Random(f"{model}:{load}:{rep}")
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(t)


def phase(name, served, load, rep, service_ms, seconds):
    times = arrivals(name, load, rep, service_ms, seconds)
    lat = []
    busy_ms = 0.0
    h = hashlib.sha256()
    start = time.perf_counter() + 0.05
    wall0 = time.time() + 0.05
    for at in times:
        due = start + at
        while True:
            now = time.perf_counter()
            if now >= due:
                break
            if due - now > 0.002:
                time.sleep(due - now - 0.001)
        y = run_once(served)
        lat.append((time.perf_counter() - due) * 1000.0)
        busy_ms += served.gpu_ms()
        if len(lat) <= 4:
            h.update(y.numpy().tobytes())
    span = max(seconds, time.perf_counter() - start)  # the last requests may end past the phase
    lat.sort()
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]  # noqa: E731
    return {"model": name, "load": load, "rep": rep, "requests": len(lat), "p50_ms": q(0.50), "p99_ms": q(0.99),
            "mean_ms": sum(lat) / len(lat), "late_2x": sum(1 for v in lat if v > 2 * service_ms) / len(lat),
            "start": wall0, "end": wall0 + seconds, "gpu_busy": busy_ms / (span * 1000.0),
            "digest": h.hexdigest()[:16]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("--service", default="", help="model=ms,... (from --calibrate on the idle GPU)")
    p.add_argument("--phases", default="")
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--ready", default="")
    p.add_argument("--models", default=",".join(sorted(BATCH)), help="the models to build (default: all)")
    a = p.parse_args()
    deterministic()
    names = sorted(a.models.split(","))
    models = {n: (Eager if n.endswith("-eager") else Served)(*inference_model(n, BATCH[n])) for n in names}
    for served in models.values():  # warm-up: the first runs of a process are slow (allocator, kernels)
        for _ in range(30):
            run_once(served)
    if a.calibrate:
        print(json.dumps({"calibrate": calibrate(models)}), flush=True)
        return
    if a.ready:
        open(a.ready, "w").close()
        deadline = time.time() + 300
        while not os.path.exists(a.ready + ".go") and time.time() < deadline:
            time.sleep(0.01)
        for served in models.values():  # warm again beside the trainer that started meanwhile
            for _ in range(10):
                run_once(served)
    service = {k: float(v) for k, v in (kv.split("=") for kv in a.service.split(","))}
    for spec in a.phases.split(","):
        name, load, rep = spec.split(":")
        r = phase(name, models[name], float(load), int(rep), service[name], a.seconds)
        print(json.dumps(r), flush=True)
        time.sleep(0.3)


if __name__ == "__main__":
    main()
