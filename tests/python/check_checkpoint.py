"""Checks a merged checkpoint (segps-checkpoint merge) against the job's
export and segps-eval, run by the own-data integration test with Debian's
/usr/bin/python3:

    check_checkpoint.py MERGED.safetensors EXPORT.safetensors TEST_X.npy TEST_Y.npy EVAL_PROBS.npy REPORT.json

The merged file is read by the small NumPy reader below (nothing of segps).
Its tensors must equal the export's bit for bit, and, with the export's
preprocessing, give segps-eval's probabilities within 1e-6 and its ensemble
accuracy, in NumPy and, where PyTorch is installed, in torch.nn layers.
Prints one line per check; exits non-zero at the first failure.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import segps_model  # noqa: E402
from check_export import compare, fail  # noqa: E402


def read_merged(path):
    """safetensors: an 8-byte little-endian header length, a JSON header, raw little-endian float32."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            fail("%s: tensor %s is %s, not F32" % (path, name, info["dtype"]))
        begin, end = info["data_offsets"]
        tensors[name] = np.frombuffer(data[8 + length + begin:8 + length + end], dtype="<f4").reshape(info["shape"])
    return tensors, metadata


def main():
    merged_path, export_path, x_path, y_path, probs_path, report_path = sys.argv[1:7]
    merged, meta = read_merged(merged_path)
    if meta.get("format") != "segps-checkpoint-merged-1":
        fail("%s: metadata format %r" % (merged_path, meta.get("format")))
    exported, export_meta = segps_model.read_safetensors(export_path)
    model_tensors = [n for n in exported if not n.startswith("preprocess/")]
    for name in model_tensors:
        if name not in merged:
            fail("merged: no tensor %s" % name)
        if merged[name].shape != exported[name].shape or not np.array_equal(merged[name], exported[name]):
            fail("merged: tensor %s differs from the export's" % name)
    print("merged: %d tensors equal the export's bit for bit; clocks %s" % (
        len(model_tensors), {k[len("segps.clock."):]: v for k, v in meta.items() if k.startswith("segps.clock.")}))

    # The merged parameters with the export's preprocessing (the servers never see the data).
    tensors = {n: merged[n] for n in model_tensors}
    tensors.update({n: exported[n] for n in exported if n.startswith("preprocess/")})
    model = segps_model.Model(tensors, export_meta)
    x, labels = np.load(x_path), np.load(y_path)
    reference = np.load(probs_path).astype(np.float64)
    with open(report_path) as f:
        accuracy = json.load(f)["ensemble"]["accuracy"]
    compare("merged numpy", model.predict(x), reference, labels, accuracy)
    try:
        import torch
    except ImportError:
        print("merged torch: not installed here; skipped")
    else:
        with torch.no_grad():
            probs = model.to_torch()(torch.from_numpy(x)).numpy()
        compare("merged torch", probs, reference, labels, accuracy)
    print("OK")


if __name__ == "__main__":
    main()
