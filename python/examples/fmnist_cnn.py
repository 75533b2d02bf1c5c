#!/usr/bin/env python3
"""A small CNN on Fashion-MNIST, its parameters held by segps servers and
trained by Python workers, each on its share of the training set; then the
same CNN trained by PyTorch alone for the same epochs from the same initial
parameters, for comparison.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/fmnist_cnn.py --servers 2 --workers 2

It writes the job config (segps.torch.job_config), starts the servers on
loopback (segps.local.Servers), starts each worker as a process of its own
(this script with --rank), scores the servers' parameters on the test set
and prints one line per run:

    segps (2 servers, 2 workers, staleness 1): test accuracy 0.8830 after 5 epochs, 17.2 s, 17463 samples/s
    pytorch alone: test accuracy 0.8772 after 5 epochs, 13.6 s, 22061 samples/s
"""

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import segps
import segps.local
import segps.torch

DATA = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 5 * 5, 10))


def load(split: str, limit: int):
    """Images as [n, 1, 28, 28] floats in [0, 1] and labels, the first `limit`."""
    with gzip.open(os.path.join(DATA, "%s-images-idx3-ubyte.gz" % split)) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(DATA, "%s-labels-idx1-ubyte.gz" % split)) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    n = min(limit, len(labels))
    return torch.from_numpy(images[:n].astype(np.float32) / 255), torch.from_numpy(labels[:n].astype(np.int64))


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def epochs_of(model, x, y, args, seed, step):
    """Runs `step(x, y)` over shuffled batches for args.epochs epochs."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(args.epochs):
        order = torch.randperm(len(y), generator=generator)
        for i in range(0, len(y), args.batch):
            batch = order[i:i + args.batch]
            step(x[batch], y[batch])


def worker(args) -> None:
    """One worker: its share of the training set (rank r of W takes rows r, r + W, ...)."""
    torch.set_num_threads(1)
    x, y = load("train", args.train_samples)
    x, y = x[args.rank::args.workers], y[args.rank::args.workers]
    model = cnn()
    ps = segps.torch.ParameterServers(model, args.config, args.addresses, rank=args.rank)

    def step(xb, yb):
        ps.pull()
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        ps.push()

    epochs_of(model, x, y, args, seed=args.rank, step=step)
    ps.close()


def distributed(args):
    job_dir = tempfile.mkdtemp(prefix="segps_fmnist_cnn_")
    config = os.path.join(job_dir, "job.pbtxt")
    with open(config, "w") as out:
        out.write(segps.torch.job_config(cnn(), "fmnist-cnn", num_servers=args.servers, workers=args.workers,
                                         staleness=args.staleness, optimizer="ADAM", learning_rate=args.lr))
    started = time.time()
    with segps.local.Servers(config, args.servers) as servers:
        # The servers' initial parameters, for PyTorch alone to start from too.
        initial = cnn()
        reader = segps.torch.ParameterServers(initial, config, servers.addresses, rank=None)
        reader.pull()
        reader.close()
        workers = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--config", config,
                                     "--addresses", ",".join(servers.addresses)] + sys.argv[1:])
                   for r in range(args.workers)]
        failed = [w.wait() for w in workers]
        seconds = time.time() - started
        if any(failed):
            raise SystemExit("a worker failed: exit statuses %s" % failed)
        model = cnn()
        reader = segps.torch.ParameterServers(model, config, servers.addresses, rank=None)
        reader.pull()
        reader.close()
    x, y = load("t10k", args.test_samples)
    score = accuracy(model, x, y)
    samples = args.epochs * min(args.train_samples, 60000)
    print("segps (%d servers, %d workers, staleness %d): test accuracy %.4f after %d epochs, %.1f s, %.0f samples/s"
          % (args.servers, args.workers, args.staleness, score, args.epochs, seconds, samples / seconds), flush=True)
    return score, initial.state_dict()


def alone(args, initial) -> float:
    torch.set_num_threads(args.workers)
    torch.manual_seed(0)
    x, y = load("train", args.train_samples)
    model = cnn()
    model.load_state_dict(initial)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    def step(xb, yb):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()

    started = time.time()
    epochs_of(model, x, y, args, seed=0, step=step)
    seconds = time.time() - started
    tx, ty = load("t10k", args.test_samples)
    score = accuracy(model, tx, ty)
    print("pytorch alone: test accuracy %.4f after %d epochs, %.1f s, %.0f samples/s"
          % (score, args.epochs, seconds, args.epochs * len(y) / seconds), flush=True)
    return score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--train_samples", type=int, default=60000)
    parser.add_argument("--test_samples", type=int, default=10000)
    parser.add_argument("--no_alone", action="store_true", help="skip the PyTorch-alone run")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a worker process
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--addresses", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args)
        return
    _, initial = distributed(args)
    if not args.no_alone:
        alone(args, initial)


if __name__ == "__main__":
    main()
