#!/usr/bin/env python3
"""Per-step cost of segps.torch beside the C++ worker, on the same dense
model (the walk-through's segment: 50 -> 64 ReLU -> 10, batch 128, Adam,
one server, one worker, staleness 1), in one run:

- segps-worker's step: its loop's seconds over its steps (its own line);
- a Python worker's step: pull, forward, backward and push through
  segps.torch, over the same number of steps;
- PyTorch's own forward and backward of the same batch, without servers.

The Python worker's overhead is its step less PyTorch's compute: what the
binding, the copies and the gradient gather add to the client's round.

    PYTHONPATH=build/python SEGPS_BIN_DIR=build/bin /usr/bin/python3 tests/bench/python_step.py [--steps N]

Prints `RESULT NAME VALUE` lines (microseconds a step) for tests/bench/run.sh.
"""

import argparse
import os
import re
import subprocess
import tempfile
import time

import torch

import segps.local
import segps.torch

LAYERED = """
name: "step-cpp"
cluster { num_servers: 1 }
optimizer { kind: ADAM learning_rate: 0.001 }
training { batch_size: 128 epochs: %d staleness: 1 workers_per_segment: 1 }
model { input_width: 50 num_classes: 10
  segments { name: "dense" layers { units: 64 activation: RELU } layers { units: 10 activation: SOFTMAX } } }
data { source: SYNTHETIC_SEED train_samples: %d test_samples: 128 }
"""


def module() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(50, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def cpp_step_us(directory: str, steps: int) -> float:
    # SYNTHETIC_SEED deals the one segment all its rows: steps x 128 of them over one epoch.
    config = os.path.join(directory, "cpp.pbtxt")
    with open(config, "w") as out:
        out.write(LAYERED % (1, steps * 128))
    with segps.local.Servers(config, 1) as servers:
        run = subprocess.run([os.path.join(os.environ["SEGPS_BIN_DIR"], "segps-worker"), "--config", config,
                              "--segment", "dense", "--servers", servers.addresses[0]],
                             capture_output=True, text=True, check=True)
    done = re.search(r"done: (\d+) steps computed here.*?samples in ([0-9.e-]+) s", run.stdout + run.stderr)
    return float(done.group(2)) / int(done.group(1)) * 1e6


def python_step_us(directory: str, steps: int, x, y) -> float:
    model = module()
    config = os.path.join(directory, "python.pbtxt")
    with open(config, "w") as out:
        out.write(segps.torch.job_config(model, "dense", staleness=1, optimizer="ADAM", learning_rate=0.001))
    with segps.local.Servers(config, 1) as servers:
        ps = segps.torch.ParameterServers(model, config, servers.addresses, rank=0)
        started = time.perf_counter()
        for step in range(steps):
            ps.pull()
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x[step]), y[step]).backward()
            ps.push()
        ps.close()
        return (time.perf_counter() - started) / steps * 1e6


def torch_step_us(steps: int, x, y) -> float:
    model = module()
    started = time.perf_counter()
    for step in range(steps):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[step]), y[step]).backward()
    return (time.perf_counter() - started) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps, 128, 50, generator=generator)
    y = torch.randint(0, 10, (args.steps, 128), generator=generator)
    directory = tempfile.mkdtemp(prefix="segps_python_step_")
    cpp = cpp_step_us(directory, args.steps)
    python = python_step_us(directory, args.steps, x, y)
    compute = torch_step_us(args.steps, x, y)
    print("per step over %d steps: segps-worker %.0f us; segps.torch %.0f us, of which PyTorch's forward and "
          "backward %.0f us: %.0f us of client, binding and copies" % (args.steps, cpp, python, compute,
                                                                         python - compute))
    print("RESULT cpp_worker_step_us %.1f" % cpp)
    print("RESULT python_worker_step_us %.1f" % python)
    print("RESULT torch_compute_step_us %.1f" % compute)
    print("RESULT python_overhead_step_us %.1f" % (python - compute))


if __name__ == "__main__":
    main()
