"""Figures of segps runs, as PNG files (matplotlib, Debian's python3-matplotlib).

    segps_plot.py learning-curves --out DIR REPORT.json [REPORT.json ...]
        DIR/learning_curves.png: training loss and test (or training) accuracy
        by epoch, one line per segment and one for the ensemble, from the
        reports' per-epoch history (segps-local writes it into every report).
    segps_plot.py bench --out DIR BENCH_OUTPUT_DIR
        From the files tests/bench/run.sh leaves: fmnist_vs_pytorch.png (test
        accuracy against training time, segps and PyTorch, every seed),
        staleness.png (the straggler study) and wire_formats.png (bytes a
        push against accuracy), each where its inputs exist.

Prints one line per file written, with the lines it drew.
"""
import argparse
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

SIZE = (10, 4)  # inches, at 100 dpi: 1000 x 400 pixels
DPI = 100


def _by_segment(report):
    """{segment: [(epoch, loss, accuracy, test accuracy or None, validation loss or None)]},
    averaged over its workers."""
    segments = {}
    for worker in report.get("history", {}).get("workers", []):
        for record in worker["epochs"]:
            segments.setdefault(worker["segment"], {}).setdefault(record["epoch"], []).append(record)
    out = {}
    for name, epochs in segments.items():
        rows = []
        for epoch in sorted(epochs):
            records = epochs[epoch]
            mean = lambda key: sum(r[key] for r in records) / len(records)  # noqa: E731
            tests = [r["test_accuracy"] for r in records if "test_accuracy" in r]
            validations = [r["validation_loss"] for r in records if "validation_loss" in r]
            rows.append((epoch, mean("loss"), mean("accuracy"), sum(tests) / len(tests) if tests else None,
                         sum(validations) / len(validations) if validations else None))
        out[name] = rows
    return out


def learning_curves_figure(reports):
    """reports: [(label, report dict)]. Left: training loss (and validation loss,
    dashed, where the run held a validation set); right: test accuracy
    (training accuracy where a run kept no test accuracy); a line per segment
    and, where the history has it, the ensemble's. A regression's report
    (model.loss MSE, with baseline_rmse) keeps the mean absolute error where
    a classifier's keeps the accuracy, and its loss is the squared error."""
    regression = any("baseline_rmse" in report for _, report in reports)
    second, loss_name = ("MAE", "mean squared error") if regression else ("accuracy", "mean cross-entropy")
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    test_seen = validation_seen = False
    for label, report in reports:
        prefix = f"{label}: " if len(reports) > 1 else ""
        for name, rows in _by_segment(report).items():
            epochs = [r[0] for r in rows]
            line, = loss_ax.plot(epochs, [r[1] for r in rows], marker="o", label=prefix + name)
            if all(r[4] is not None for r in rows):
                validation_seen = True
                loss_ax.plot(epochs, [r[4] for r in rows], marker="x", linestyle="--", color=line.get_color(),
                             label=prefix + name + " (validation)")
            has_test = all(r[3] is not None for r in rows)
            test_seen |= has_test
            acc_ax.plot(epochs, [r[3] if has_test else r[2] for r in rows], marker="o", label=prefix + name)
        ensemble = report.get("history", {}).get("ensemble", [])
        if ensemble:
            acc_ax.plot([e["epoch"] for e in ensemble], [e["test_accuracy"] for e in ensemble], marker="s",
                        linestyle="--", color="black", label=prefix + "ensemble")
    loss_ax.set(title="training and validation loss" if validation_seen else f"training loss ({loss_name})",
                xlabel="epoch", ylabel=f"loss ({loss_name})")
    acc_ax.set(title=f"test {second}" if test_seen else f"training {second}", xlabel="epoch", ylabel=second)
    for ax in (loss_ax, acc_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    name = reports[0][1].get("job", "segps") if len(reports) == 1 else "segps"
    fig.suptitle(f"{name}: learning curves")
    fig.tight_layout()
    return fig


def _save(fig, path):
    fig.savefig(path, dpi=DPI)
    lines = sum(len(ax.get_lines()) for ax in fig.axes)
    plt.close(fig)
    print(f"wrote {path}: {lines} lines")


def _epoch_curve(path, pattern):
    """[(cumulative seconds, accuracy)] from a log, by `pattern` (groups: accuracy, seconds)."""
    points = []
    with open(path) as f:
        for line in f:
            m = re.search(pattern, line)
            if m:
                points.append((float(m.group("seconds")), float(m.group("accuracy"))))
    return points


def fmnist_figure(bench):
    """Test accuracy against training time: segps (fm88_SEED.txt) and PyTorch
    (torch_fmSEED.txt), one line per seed each."""
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    drawn = 0
    for side, files, color in (("segps", "fm88_*.txt", "tab:blue"), ("PyTorch", "torch_fm*.txt", "tab:orange")):
        for i, path in enumerate(sorted(glob.glob(os.path.join(bench, files)))):
            if side == "segps":
                points = _epoch_curve(path, r"test accuracy (?P<accuracy>[0-9.]+) after (?P<seconds>[0-9.]+) s")
            else:  # epoch times, to be summed
                per_epoch = _epoch_curve(path, r"train (?P<seconds>[0-9.]+)s .*test_acc=(?P<accuracy>[0-9.]+)")
                total, points = 0.0, []
                for seconds, accuracy in per_epoch:
                    total += seconds
                    points.append((total, accuracy))
            if points:
                ax.plot(*zip(*points), marker=".", color=color, alpha=0.7, label=side if i == 0 else None)
                drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.axhline(0.88, color="gray", linestyle=":", label="88%")
    ax.set(title="Fashion-MNIST MLP 784-256-128-10: test accuracy against training time (one line per seed)",
           xlabel="training seconds", ylabel="test accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def _table(path, widths):
    """Rows of a table printed with fixed column widths (printf "%-Ns %Ns ..."),
    a field left empty where the bench had no value; a header line starts a
    new block."""
    rows, block = [], -1
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            if line.split()[0] in ("staleness", "wire"):
                block += 1
                continue
            fields, at = [], 0
            for width in widths:
                fields.append(line[at:at + width].strip())
                at += width + 1
            rows.append((block, fields))
    return rows


def _number(text):
    try:
        return float(text.rstrip("%"))
    except ValueError:
        return None


def staleness_figure(bench):
    """The straggler study: job seconds and share of time blocked by bound, per task."""
    path = os.path.join(bench, "staleness.txt")
    if not os.path.exists(path):
        return None
    rows = _table(path, [10, 10, 10, 14, 10])  # staleness, seconds, blocked, s to bar, accuracy
    tasks = sorted({b for b, _ in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=SIZE, dpi=DPI, squeeze=False)
    names = ["teacher (2 x 2 workers)", "Fashion-MNIST (2 workers)"]
    for ax, task in zip(axes[0], tasks):
        task_rows = [f for b, f in rows if b == task]
        labels = [f[0] for f in task_rows]
        seconds = [_number(f[1]) or 0 for f in task_rows]
        blocked = [_number(f[2]) or 0 for f in task_rows]
        ax.plot(labels, seconds, marker="o", color="tab:blue", label="job seconds")
        twin = ax.twinx()
        twin.plot(labels, blocked, marker="s", color="tab:red", label="blocked %")
        for x, f in zip(labels, task_rows):
            ax.annotate(f"acc {f[4]}", (x, _number(f[1]) or 0), fontsize=7, textcoords="offset points",
                        xytext=(0, 6), ha="center")
        ax.set(title=names[task] if task < len(names) else f"task {task}", xlabel="staleness bound")
        twin.set_ylabel("time blocked (%)", color="tab:red")
        ax.set_ylabel("job seconds", color="tab:blue")
        ax.tick_params(axis="x", labelrotation=20)
        ax.grid(alpha=0.3)
    fig.suptitle("one straggler (2 ms a step): time and waiting by staleness bound")
    fig.tight_layout()
    return fig


def wire_figure(bench):
    """Bytes a push against accuracy, one point per wire format."""
    path = os.path.join(bench, "wire.txt")
    if not os.path.exists(path):
        return None
    rows = [f for _, f in _table(path, [18, 12, 12, 14, 10])  # wire, push B, pull B, samples/s, accuracy
            if _number(f[1]) is not None and _number(f[4]) is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    ax.plot([_number(f[1]) for f in rows], [_number(f[4]) for f in rows], marker="o", linestyle="none")
    for f in rows:
        ax.annotate(f[0], (_number(f[1]), _number(f[4])), fontsize=8, textcoords="offset points", xytext=(4, 4))
    ax.set_xscale("log")
    ax.set(title="Fashion-MNIST MLP, 8 epochs: bytes a push against test accuracy", xlabel="push bytes a step",
           ylabel="ensemble test accuracy")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def scale_figure(bench):
    """Scaling: worker steps per second and p99 round time against workers, per servers and staleness."""
    path = os.path.join(bench, "scale.txt")
    if not os.path.exists(path):
        return None
    rows = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 11 and fields[0].isdigit():
                rows.append(fields)
    if not rows:
        return None
    fig, (ax, lat) = plt.subplots(1, 2, figsize=SIZE, dpi=DPI)
    for servers, staleness in sorted({(int(r[1]), int(r[2])) for r in rows}):
        sel = sorted((int(r[0]), float(r[3]), float(r[6])) for r in rows if int(r[1]) == servers and int(r[2]) == staleness)
        style = "-" if staleness == 0 else "--"
        label = f"{servers} server{'s' if servers > 1 else ''}, s={staleness}"
        ax.plot([n for n, _, _ in sel], [v for _, v, _ in sel], style, marker="o", label=label)
        lat.plot([n for n, _, _ in sel], [p for _, _, p in sel], style, marker="o", label=label)
    ax.set(xscale="log", title="worker steps per second", xlabel="concurrent workers")
    lat.set(xscale="log", yscale="log", title="p99 round (ms)", xlabel="concurrent workers")
    for a in (ax, lat):
        a.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle("segps-bench-scale: synchronous rounds of a 330-parameter model")
    fig.tight_layout()
    return fig


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    curves = sub.add_parser("learning-curves")
    curves.add_argument("--out", required=True)
    curves.add_argument("reports", nargs="+")
    bench = sub.add_parser("bench")
    bench.add_argument("--out", required=True)
    bench.add_argument("bench_dir")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.command == "learning-curves":
        reports = []
        for path in args.reports:
            with open(path) as f:
                report = json.load(f)
            if not report.get("history", {}).get("workers"):
                sys.exit(f"segps_plot: {path} has no per-epoch history (reports of segps-local have it)")
            reports.append((os.path.splitext(os.path.basename(path))[0], report))
        _save(learning_curves_figure(reports), os.path.join(args.out, "learning_curves.png"))
        return
    for name, make in (("fmnist_vs_pytorch", fmnist_figure), ("staleness", staleness_figure),
                       ("wire_formats", wire_figure), ("scaling", scale_figure)):
        fig = make(args.bench_dir)
        if fig is None:
            print(f"skipped {name}.png: its inputs are not in {args.bench_dir}")
        else:
            _save(fig, os.path.join(args.out, name + ".png"))


if __name__ == "__main__":
    main(sys.argv[1:])
