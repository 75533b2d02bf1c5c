# PyTorch reference for segps-bench-step: median ms of a forward+backward step
# (cross-entropy, no optimizer) of the same MLPs, on the same device.
#   /usr/bin/python3 tests/bench/torch_step.py --device cuda [--models ...] [--steps 20]
import argparse
import time

import torch
import torch.nn as nn

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda")
ap.add_argument("--models", default="50-64-10@128,784-256-128-10@128,1024-1024-1024-10@4096,"
                "4096-4096-4096-10@4096,8192-8192-8192-10@4096")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--tf32", action="store_true")
args = ap.parse_args()
torch.backends.cuda.matmul.allow_tf32 = args.tf32
dev = torch.device(args.device)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


print("%-28s %6s %12s %10s" % ("model", "batch", "torch_ms", "TFLOP/s"))
for spec in args.models.split(","):
    widths_s, batch_s = spec.split("@")
    widths = [int(w) for w in widths_s.split("-")]
    batch = int(batch_s)
    layers = []
    flops = 0.0
    for i in range(1, len(widths)):
        layers.append(nn.Linear(widths[i - 1], widths[i]))
        if i + 1 < len(widths):
            layers.append(nn.ReLU())
        mac = batch * widths[i - 1] * widths[i]
        flops += 4 * mac + (2 * mac if i > 1 else 0)
    model = nn.Sequential(*layers).to(dev)
    x = torch.rand(batch, widths[0], device=dev)
    y = torch.randint(widths[-1], (batch,), device=dev)
    lossf = nn.CrossEntropyLoss()
    times = []
    for i in range(3 + args.steps):
        sync()
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        lossf(model(x), y).backward()
        sync()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    print("%-28s %6d %12.3f %10.2f" % (widths_s, batch, med * 1e3, flops / med / 1e12), flush=True)
