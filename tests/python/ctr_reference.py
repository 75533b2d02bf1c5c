#!/usr/bin/env python3
"""PyTorch alone on deploy/configs/ctr.pbtxt's task: the ctr segment's
model (an nn.Embedding(sparse=True) per table, the tables' rows after the
dense features, 32 ReLU, 2 classes) trained with Adagrad on the same data
(written by `segps-data --config deploy/configs/ctr.pbtxt --out DIR`), for
the test AUC and the training samples a second that segps is held to
(tests/python/ctr_test.py, bench section 12).

    /usr/bin/python3 tests/python/ctr_reference.py DIR [--epochs 4]

Prints `pytorch ctr: auc 0.NNNN, N samples/s`. Rows start as segps's do,
uniform in [-0.05, 0.05); dense layers Glorot-uniform with zero biases.
A 100M-row vocab is compacted to the ids the data holds (untouched rows
never change under Adagrad, so the model is the same).
"""

import argparse
import os
import time

import numpy as np
import torch

TABLES = (("user", 8, (0,)), ("item", 8, (1, 2)))  # name, dim, fields: as deploy/configs/ctr.pbtxt


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The ROC AUC: the chance that a positive outscores a negative (ties half)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = labels == 1
    n_pos, n_neg = positives.sum(), (~positives).sum()
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class Ctr(torch.nn.Module):
    def __init__(self, rows_per_table, dense_width: int):
        super().__init__()
        self.tables = torch.nn.ModuleList(torch.nn.Embedding(n, dim, sparse=True)
                                          for n, (_, dim, _) in zip(rows_per_table, TABLES))
        for table in self.tables:
            torch.nn.init.uniform_(table.weight, -0.05, 0.05)
        width = dense_width + sum(dim * len(fields) for _, dim, fields in TABLES)
        self.hidden, self.out = torch.nn.Linear(width, 32), torch.nn.Linear(32, 2)
        for layer in (self.hidden, self.out):
            torch.nn.init.xavier_uniform_(layer.weight)
            torch.nn.init.zeros_(layer.bias)

    def forward(self, x, ids):
        parts = [x] + [table(ids[:, field]) for table, (_, _, fields) in zip(self.tables, TABLES) for field in fields]
        return self.out(torch.relu(self.hidden(torch.cat(parts, 1))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    load = lambda name: np.load(os.path.join(args.dir, name))
    train_x, train_y, train_ids = load("train_x.npy"), load("train_y.npy"), load("train_ids.npy")
    test_x, test_y, test_ids = load("test_x.npy"), load("test_y.npy"), load("test_ids.npy")
    # Each table's ids over the fields it serves, compacted to 0..n-1.
    compact_train, compact_test, sizes = train_ids.copy(), test_ids.copy(), []
    for _, _, fields in TABLES:
        both = np.concatenate([train_ids[:, fields].ravel(), test_ids[:, fields].ravel()])
        unique, index = np.unique(both, return_inverse=True)
        n_train = train_ids[:, fields].size
        compact_train[:, fields] = index[:n_train].reshape(-1, len(fields))
        compact_test[:, fields] = index[n_train:].reshape(-1, len(fields))
        sizes.append(len(unique))
    model = Ctr(sizes, train_x.shape[1])
    optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr, eps=1e-7)  # segps's epsilon
    x, y, ids = torch.from_numpy(train_x), torch.from_numpy(train_y).long(), torch.from_numpy(compact_train)
    started = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(len(y))
        for i in range(0, len(y), args.batch):
            batch = order[i:i + args.batch]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch], ids[batch]), y[batch]).backward()
            optimizer.step()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        logits = model(torch.from_numpy(test_x), torch.from_numpy(compact_test))
        scores = torch.softmax(logits, 1)[:, 1].numpy()
    print("pytorch ctr: auc %.4f, %.0f samples/s" % (auc(scores, test_y), args.epochs * len(y) / seconds))


if __name__ == "__main__":
    main()
