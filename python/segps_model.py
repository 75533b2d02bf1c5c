"""Load a segps model export (segps-export, segps-local --export) into NumPy
arrays, run it, or turn it into PyTorch modules.

    import segps_model
    model = segps_model.load("model.safetensors")
    probs = model.predict(x)              # the ensemble; model.predict(x, "relu64") for one segment
    net = model.to_torch()                # torch.nn.Module: the ensemble (needs PyTorch)

A model with embedding tables also takes each row's categorical ids
[n, categorical_fields] (int): model.predict(x, ids=ids), net(x, ids).

A CHAIN job's export is one network: its segments are consecutive stages,
which predict(x) and to_torch()'s module run in turn.

Needs only NumPy; PyTorch is imported by to_torch() alone. The computation is
segps's own: x * input_scale, then (x - mean) / std if the job standardised
its features, then per segment (after f, the rows its tables hold for the
ids of their fields, table after table) dense layers h @ kernel + bias with their
activations, and the ensemble as the mean of the segments' softmax outputs
(or, for a chain, each stage applied to the previous stage's output).
"""
import json
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
           "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path):
    """Every tensor of a safetensors file as a NumPy array, and its metadata."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {})
    body = memoryview(data)[8 + length:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
        tensors[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(info["shape"]).copy()
    return tensors, metadata


def _activation(name, h):
    if name == "RELU":
        return np.maximum(h, np.float32(0))
    if name == "TANH":
        return np.tanh(h)
    if name == "SIGMOID":
        return np.float32(1) / (np.float32(1) + np.exp(-h))
    if name == "SOFTMAX":
        e = np.exp(h - h.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    return h


class Model:
    """A trained segps model: `segments` (names, in order), `layers[name]`
    (a list of (kernel [in, out], bias [out], activation)), preprocessing,
    and `chain`: whether the segments are the stages of one network."""

    def __init__(self, tensors, metadata):
        if metadata.get("format") != "segps-model-1":
            raise ValueError("not a segps model export (metadata format %r)" % metadata.get("format"))
        self.metadata = metadata
        self.architecture = json.loads(metadata["segps.model"])
        self.input_width = int(self.architecture["input_width"])
        self.num_classes = int(self.architecture["num_classes"])
        self.input_scale = np.float32(float(metadata["segps.input_scale"]))
        self.mean = tensors.get("preprocess/mean")
        self.std = tensors.get("preprocess/std")
        self.segments = [s["name"] for s in self.architecture["segments"]]
        self.chain = self.architecture.get("combine") == "CHAIN"
        self.fields = int(self.architecture.get("categorical_fields", 0))
        # Per segment: (name, rows [vocab, dim], the id columns it looks up), in order.
        self.tables = {seg["name"]: [(t["name"], tensors["%s/embeddings/%s" % (seg["name"], t["name"])],
                                      [int(c) for c in t.get("field", [])])
                                     for t in seg.get("embeddings", [])]
                       for seg in self.architecture["segments"]}
        self.layers = {}
        for seg in self.architecture["segments"]:
            self.layers[seg["name"]] = [
                (tensors["%s/dense_%d/kernel" % (seg["name"], i)], tensors["%s/dense_%d/bias" % (seg["name"], i)],
                 layer["activation"]) for i, layer in enumerate(seg["layers"])]

    def preprocess(self, x):
        """Raw input rows [n, input_width] as the network sees them (float32)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.input_width:
            raise ValueError("inputs must have shape [n, %d], got %s" % (self.input_width, x.shape))
        f = x.astype(np.float32)
        if self.input_scale != 1:
            f = f * self.input_scale
        if self.mean is not None:
            f = (f - self.mean) / self.std
        return f

    def check_ids(self, ids, n):
        """The ids as int64 [n, categorical_fields], each within its tables' vocab."""
        if self.fields == 0:
            if ids is not None:
                raise ValueError("this model has no embedding tables: give no ids")
            return None
        if ids is None:
            raise ValueError("this model looks up %d categorical ids a row: give ids" % self.fields)
        ids = np.asarray(ids)
        if ids.shape != (n, self.fields) or ids.dtype.kind not in "iu":
            raise ValueError("ids must be integers of shape [%d, %d], got %s %s" % (n, self.fields, ids.dtype,
                                                                                     ids.shape))
        for tables in self.tables.values():
            for name, rows, fields in tables:
                for c in fields:
                    bad = (ids[:, c] < 0) | (ids[:, c] >= rows.shape[0])
                    if bad.any():
                        r = int(np.argmax(bad))
                        raise ValueError("ids row %d field %d: %d is outside table %s's [0, %d)" %
                                         (r, c, ids[r, c], name, rows.shape[0]))
        return ids.astype(np.int64)

    def predict(self, x, segment=None, ids=None):
        """Class probabilities [n, num_classes]: the ensemble's or the
        chain's, or one segment's of an ensemble."""
        f = self.preprocess(x)
        ids = self.check_ids(ids, f.shape[0])
        if self.chain:
            if segment is not None:
                raise ValueError("%s is a stage of one network (a chain), which predicts only as a whole" % segment)
            for name in self.segments:
                f = self._segment(name, f)
            return f
        if segment is not None:
            return self._segment(segment, f, ids)
        total = np.zeros((f.shape[0], self.num_classes), dtype=np.float64)
        for name in self.segments:
            total += self._segment(name, f, ids).astype(np.float64) / len(self.segments)
        return total.astype(np.float32)

    def _segment(self, name, h, ids=None):
        if self.tables[name]:
            h = np.concatenate([h] + [rows[ids[:, c]] for _, rows, fields in self.tables[name] for c in fields],
                               axis=1)
        for kernel, bias, activation in self.layers[name]:
            h = _activation(activation, h @ kernel + bias)
        return h

    def to_torch(self):
        """The model as a torch.nn.Module over raw inputs; its `.segments` is
        an nn.ModuleDict of one nn.Sequential per segment, averaged (an
        ensemble) or applied one after another (a chain)."""
        import torch
        from torch import nn

        activations = {"RELU": nn.ReLU, "TANH": nn.Tanh, "SIGMOID": nn.Sigmoid, "IDENTITY": nn.Identity,
                       "SOFTMAX": lambda: nn.Softmax(dim=1)}
        model = self

        class Ensemble(nn.Module):
            def __init__(self):
                super().__init__()
                self.segments = nn.ModuleDict()
                self.tables = nn.ModuleDict()  # "SEGMENT/TABLE"
                for name in model.segments:
                    modules = []
                    for kernel, bias, activation in model.layers[name]:
                        linear = nn.Linear(kernel.shape[0], kernel.shape[1])
                        with torch.no_grad():
                            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel.T)))
                            linear.bias.copy_(torch.from_numpy(bias))
                        modules += [linear, activations[activation]()]
                    self.segments[name.replace(".", "_")] = nn.Sequential(*modules)
                    for table, rows, _ in model.tables[name]:
                        self.tables["%s/%s" % (name, table)] = nn.Embedding.from_pretrained(
                            torch.from_numpy(rows), freeze=False)
                self.register_buffer("scale", torch.tensor(float(model.input_scale)))
                self.standardize = model.mean is not None
                if self.standardize:
                    self.register_buffer("mean", torch.from_numpy(model.mean))
                    self.register_buffer("std", torch.from_numpy(model.std))

            def forward(self, x, ids=None):
                x = x.to(torch.float32) * self.scale
                if self.standardize:
                    x = (x - self.mean) / self.std
                if model.chain:
                    for seg in self.segments.values():
                        x = seg(x)
                    return x
                outputs = [seg(self.first_input(name, x, ids)) for name, seg in zip(model.segments,
                                                                                  self.segments.values())]
                return torch.stack(outputs).mean(dim=0)

            def first_input(self, name, x, ids):
                """x followed by the rows segment `name`'s tables look up."""
                if not model.tables[name]:
                    return x
                rows = [self.tables["%s/%s" % (name, table)](ids[:, c].to(torch.int64))
                        for table, _, fields in model.tables[name] for c in fields]
                return torch.cat([x] + rows, dim=1)

        return Ensemble().eval()


def load(path):
    """The model of a segps-export safetensors file."""
    return Model(*read_safetensors(path))
