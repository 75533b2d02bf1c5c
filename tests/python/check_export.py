"""Checks a segps export against segps-eval, run by the own-data integration
test with Debian's /usr/bin/python3:

    check_export.py MODEL.safetensors MODEL.onnx TEST_X.npy TEST_Y.npy EVAL_PROBS.npy REPORT.json [TEST_IDS.npy]

(TEST_IDS.npy: the test rows' categorical ids, for a model with embedding
tables.)

The export, read by python/segps_model.py, must reproduce segps-eval's
ensemble accuracy exactly and its probabilities within 1e-6; the ONNX file
must pass onnx's checker, and a NumPy walk over its graph must give the same
probabilities; where PyTorch is installed, so must the model's to_torch().
Prints one line per check; exits non-zero at the first failure.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import segps_model  # noqa: E402

TOLERANCE = 1e-6


def fail(message):
    print("FAIL:", message)
    sys.exit(1)


def compare(name, probs, reference, labels, accuracy):
    if probs.shape != reference.shape:
        fail("%s: shape %s, segps-eval's %s" % (name, probs.shape, reference.shape))
    diff = float(np.abs(probs.astype(np.float64) - reference).max())
    acc = float((probs.argmax(axis=1) == labels).mean())
    print("%s: max |p - eval| = %.3g, accuracy %.6f (segps-eval %.6f)" % (name, diff, acc, accuracy))
    if diff > TOLERANCE:
        fail("%s: probabilities differ from segps-eval's by %.3g > %g" % (name, diff, TOLERANCE))
    if abs(acc - accuracy) > 5e-7:
        fail("%s: accuracy %.6f, segps-eval's %.6f" % (name, acc, accuracy))


def onnx_walk(model, x, ids=None):
    """Runs the graph node by node with NumPy (the ops segps-export writes)."""
    from onnx import numpy_helper
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    values[model.graph.input[0].name] = x.astype(np.float32)
    if ids is not None:
        values[model.graph.input[1].name] = ids.astype(np.int64)
    for node in model.graph.node:
        args = [values[i] for i in node.input]
        op = node.op_type
        if op == "Gemm":
            out = args[0] @ args[1] + args[2]
        elif op == "Relu":
            out = np.maximum(args[0], np.float32(0))
        elif op == "Tanh":
            out = np.tanh(args[0])
        elif op == "Sigmoid":
            out = np.float32(1) / (np.float32(1) + np.exp(-args[0]))
        elif op == "Softmax":
            e = np.exp(args[0] - args[0].max(axis=1, keepdims=True))
            out = e / e.sum(axis=1, keepdims=True)
        elif op == "Identity":
            out = args[0]
        elif op == "Gather":
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            out = np.take(args[0], args[1], axis=axis)
        elif op == "Concat":
            out = np.concatenate(args, axis=next(a.i for a in node.attribute if a.name == "axis"))
        elif op == "Mean":
            out = sum(a.astype(np.float64) for a in args) / len(args)
        elif op == "Mul":
            out = args[0] * args[1]
        elif op == "Sub":
            out = args[0] - args[1]
        elif op == "Div":
            out = args[0] / args[1]
        else:
            fail("onnx: unexpected op %s" % op)
        values[node.output[0]] = out
    return values[model.graph.output[0].name]


def main():
    model_path, onnx_path, x_path, y_path, probs_path, report_path = sys.argv[1:7]
    ids = np.load(sys.argv[7]) if len(sys.argv) > 7 else None
    x, labels = np.load(x_path), np.load(y_path)
    reference = np.load(probs_path).astype(np.float64)
    with open(report_path) as f:
        accuracy = json.load(f)["ensemble"]["accuracy"]

    model = segps_model.load(model_path)
    compare("numpy", model.predict(x, ids=ids), reference, labels, accuracy)

    import onnx
    graph = onnx.load(onnx_path)
    onnx.checker.check_model(graph, full_check=True)
    print("onnx: checker accepts %s (opset %d)" % (onnx_path, graph.opset_import[0].version))
    compare("onnx", onnx_walk(graph, x, ids), reference, labels, accuracy)

    try:
        import torch
    except ImportError:
        print("torch: not installed here; skipped")
    else:
        with torch.no_grad():
            probs = model.to_torch()(torch.from_numpy(x), None if ids is None else torch.from_numpy(ids)).numpy()
        compare("torch", probs, reference, labels, accuracy)
    print("OK")


if __name__ == "__main__":
    main()
