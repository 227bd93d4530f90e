"""One CUDA-graph workload for test/gpu/capture/run.sh: a small MLP captured once and replayed.

  python3 capture.py --mode graph|compile --steps N --ballast-gb G [--seed S]

graph    torch.cuda.graph capture of the MLP's forward (its intermediate tensors are allocated during
         the capture, from the graph's private pool), then N steps of copy-input + replay
compile  torch.compile(mode="reduce-overhead") of the same MLP (CUDA graphs through cudagraph trees)
The ballast (G GiB, written once and checked at the end) makes the working set large enough that two
processes do not fit a small budget together, so the shim swaps at each hand-off; with --barrier DIR
--procs N the processes start capturing only once all N hold their ballast. Between steps the
process sleeps a little, so the other process gets the GPU. Prints one line of JSON: the sha256 of
every step's output bytes, in order, and the ballast's check.
"""
import argparse
import hashlib
import json
import os
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["graph", "compile"], default="graph")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ballast-gb", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sleep-ms", type=float, default=30)
    ap.add_argument("--barrier", default="", help="directory: wait here until --procs processes are ready")
    ap.add_argument("--procs", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    ballast = torch.full((int(a.ballast_gb * (1 << 30)) // 4,), 3.0, device=dev)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(),
        torch.nn.Linear(4096, 1024)).to(dev).eval()
    gen = torch.Generator().manual_seed(a.seed + 1)
    inputs = [torch.randn(256, 1024, generator=gen) for _ in range(a.steps)]
    if a.barrier:
        # Both processes hold their memory before either captures: the pair overlaps, so they swap.
        open(os.path.join(a.barrier, "ready.%d" % os.getpid()), "w").close()
        deadline = time.time() + 300
        while len([f for f in os.listdir(a.barrier) if f.startswith("ready.")]) < a.procs and time.time() < deadline:
            time.sleep(0.01)
    h = hashlib.sha256()
    t0 = time.time()
    with torch.no_grad():
        if a.mode == "graph":
            static_x = torch.zeros(256, 1024, device=dev)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(static_x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_y = model(static_x)
            for x in inputs:
                static_x.copy_(x.to(dev))
                g.replay()
                h.update(static_y.cpu().numpy().tobytes())
                time.sleep(a.sleep_ms / 1000)
        else:
            fn = torch.compile(model, mode="reduce-overhead")
            for x in inputs:
                y = fn(x.to(dev))
                h.update(y.cpu().numpy().tobytes())
                time.sleep(a.sleep_ms / 1000)
    torch.cuda.synchronize()
    ok = bool((ballast == 3.0).all().item())
    print(json.dumps({"sha256": h.hexdigest(), "ballast_ok": ok, "steps": a.steps, "mode": a.mode,
                      "alloc": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"),
                      "secs": round(time.time() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
