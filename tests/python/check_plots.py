"""Checks python/segps_plot.py on a real run's report, run by the launcher
plot test with Debian's /usr/bin/python3:

    check_plots.py REPORT.json PLOT_DIR

PLOT_DIR/learning_curves.png (written by segps-local --plot) must decode to
1000 x 400 pixels, and the figure must hold one line per segment in each
panel plus the ensemble's in the accuracy panel. Exits non-zero otherwise.
"""
import json
import os
import sys

import matplotlib.image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import segps_plot  # noqa: E402


def main():
    report_path, plot_dir = sys.argv[1:3]
    with open(report_path) as f:
        report = json.load(f)
    segments = [s["name"] for s in report["segments"]]
    image = matplotlib.image.imread(os.path.join(plot_dir, "learning_curves.png"))
    print("learning_curves.png: %d x %d pixels" % (image.shape[1], image.shape[0]))
    if image.shape[:2] != (400, 1000):
        sys.exit("FAIL: expected 1000 x 400 pixels")
    loss_ax, acc_ax = segps_plot.learning_curves_figure([("run", report)]).axes
    loss_lines = [line.get_label() for line in loss_ax.get_lines()]
    acc_lines = [line.get_label() for line in acc_ax.get_lines()]
    print("loss panel:", loss_lines, "accuracy panel:", acc_lines)
    if sorted(loss_lines) != sorted(segments) or sorted(acc_lines) != sorted(segments + ["ensemble"]):
        sys.exit("FAIL: expected one line per segment %s (and the ensemble's for accuracy)" % segments)
    epochs = report["epochs"]
    for line in loss_ax.get_lines() + acc_ax.get_lines():
        if len(line.get_xdata()) != epochs:
            sys.exit("FAIL: line %s has %d points for %d epochs" % (line.get_label(), len(line.get_xdata()), epochs))
    print("OK")


if __name__ == "__main__":
    main()
