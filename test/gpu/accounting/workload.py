# One GPU workload for test/gpu/accounting/run.sh: holds GIB of device memory and runs matrix products
# for BUSY seconds of every second (the rest idle), until killed.
import sys, time, torch

gib, busy = float(sys.argv[1]), float(sys.argv[2])
ballast = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
print("ready", flush=True)
while True:
    t0 = time.time()
    while time.time() - t0 < busy:
        a = (a @ a).tanh_()
        torch.cuda.synchronize()
    time.sleep(max(0.0, 1.0 - busy))
