"""A torch.nn.Module whose parameters segps servers hold (docs/python.md).

    text = segps.torch.job_config(model, name="fmnist-cnn", num_servers=2, workers=2, staleness=1,
                                  optimizer="ADAM", learning_rate=1e-3)
    ps = segps.torch.ParameterServers(model, config="job.pbtxt", servers="host:port,host:port", rank=0)
    for x, y in batches:
        ps.pull()                # the module's parameters from the servers
        model.zero_grad(); loss_fn(model(x), y).backward()
        ps.push()                # its gradients to the servers
    ps.close()

The module's parameters are views into one flat float32 buffer that
``pull`` fills in place, so a pull costs one copy from the wire; their
``.grad`` start as views into a second buffer that backward accumulates
into and ``push`` sends (a gradient elsewhere, after ``zero_grad(
set_to_none=True)``, is copied in; a parameter without one pushes zeros). Buffers (BatchNorm's running statistics) stay
local to each worker.
"""

import math
from typing import Dict, Optional, Union

import numpy as np
import torch

from . import Client, Servers

__all__ = ["ParameterServers", "job_config", "tensors_config"]


def _init(module: torch.nn.Module, name: str, tensor: torch.Tensor, fan_in: Dict[int, int]) -> str:
    """The TensorConfig init of one parameter, as PyTorch initialises it."""
    norm = isinstance(module, (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm))
    if norm:
        return "constant: 1" if name == "weight" else "constant: 0"
    if isinstance(module, torch.nn.Embedding):
        return "uniform: %.9g" % math.sqrt(3.0)  # variance 1, as N(0, 1)
    if tensor.dim() > 1:
        return "uniform: %.9g" % (1.0 / math.sqrt(tensor[0].numel()))
    if name == "bias" and id(module) in fan_in:
        return "uniform: %.9g" % (1.0 / math.sqrt(fan_in[id(module)]))
    return "constant: 0"


def tensors_config(model: torch.nn.Module, name: str) -> str:
    """The ``segments { ... }`` block declaring ``model``'s parameters, in
    ``named_parameters`` order, with PyTorch's default initialisation."""
    fan_in = {id(m): m.weight[0].numel() for m in model.modules()
              if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() > 1}
    owner = {}
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            owner[(module_name + "." if module_name else "") + param_name] = (module, param_name)
    lines = ['segments {', '  name: "%s"' % name]
    for param_name, tensor in model.named_parameters():
        module, short = owner[param_name]
        shape = " ".join("shape: %d" % d for d in tensor.shape)
        lines.append('  tensors { name: "%s" %s %s }' % (param_name, shape, _init(module, short, tensor, fan_in)))
    lines.append("}")
    return "\n".join(lines)


def job_config(model: torch.nn.Module, name: str, num_servers: int = 1, workers: int = 1, staleness: int = 0,
               optimizer: str = "ADAM", learning_rate: float = 1e-3, extra: str = "") -> str:
    """The job config (text format) for training ``model`` as one segment
    named ``name``: write it to a file for the servers and the workers.
    ``extra`` is appended (a ``checkpoint { ... }`` block, say). Checked as
    the servers check it (raises segps.Error)."""
    text = "\n".join([
        'name: "%s"' % name,
        "cluster { num_servers: %d }" % num_servers,
        # torch.optim.Adam's and Adagrad's epsilon (segps's own default is Keras's 1e-7).
        "optimizer { kind: %s learning_rate: %.9g%s }" % (
            optimizer, learning_rate, " epsilon: 1e-08" if optimizer == "ADAM" else
            " epsilon: 1e-10" if optimizer == "ADAGRAD" else ""),
        "training { staleness: %d workers_per_segment: %d }" % (staleness, workers),
        "model {",
        tensors_config(model, name),
        "}",
        extra,
    ]) + "\n"
    from . import check_config
    check_config(text=text)
    return text


class ParameterServers:
    """Binds ``model``'s parameters to a segment of a segps job.

    Args:
        model: the module; its ``named_parameters()`` must match the
            segment's tensors (names, order and shapes).
        config, servers, segment, rank, tls_ca, tls_cert, tls_key,
            token_file: as segps.Client (rank None: a reader that only
            pulls, for evaluation).

    Raises:
        ValueError: the module does not match the segment, naming the
            first tensor that differs.
        segps.Error: the servers refused or failed (the message says why).
    """

    def __init__(self, model: torch.nn.Module, config: str = "", servers: Servers = None,
                 rank: Union[int, str, None] = "auto", segment: Optional[Union[str, int]] = None,
                 **client_args) -> None:
        self._client = Client(config, servers, segment, rank, **client_args)
        self._params = [p for _, p in model.named_parameters()]
        declared = self._client.tensors()
        try:
            self._check(model, declared)
        except ValueError:
            self._client.close()  # leaves at once, rather than when collected
            raise
        self._flat = np.zeros(self._client.size, dtype=np.float32)
        self._grad = np.zeros(self._client.size, dtype=np.float32)
        flat, self._grad_t = torch.from_numpy(self._flat), torch.from_numpy(self._grad)
        self._grad_views = []
        with torch.no_grad():
            for p, (_, _, offset) in zip(self._params, declared):
                view = flat[offset:offset + p.numel()].view(p.shape)
                view.copy_(p.data)
                p.data = view
                # Backward accumulates into an existing .grad in place: the
                # gradient lands in the push buffer unless zero_grad set it to None.
                p.grad = self._grad_t[offset:offset + p.numel()].view(p.shape)
                self._grad_views.append(p.grad)

    def _check(self, model: torch.nn.Module, declared) -> None:
        names = [n for n, _ in model.named_parameters()]
        if len(names) != len(declared):
            raise ValueError("segment %s declares %d tensors; the module has %d parameters"
                             % (self._client.segment, len(declared), len(names)))
        for (name, p), (want, shape, _) in zip(model.named_parameters(), declared):
            if name != want or list(p.shape) != list(shape):
                raise ValueError("segment %s: tensor %s of shape %s, but the module's parameter there is %s of "
                                 "shape %s" % (self._client.segment, want, list(shape), name, list(p.shape)))
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError("parameter %s: segps holds float32 on the CPU; move the module there "
                                 "(model.float().cpu()) first" % name)

    @property
    def client(self) -> Client:
        return self._client

    def pull(self) -> int:
        """The module's parameters from the servers, in place; waits only as
        the staleness bound requires. The clock they reflect."""
        self._client.pull(self._flat)
        return self._client.clock

    def push(self) -> None:
        """The module's gradients (``.grad``) to the servers, asynchronously
        within the bound; call after ``pull`` and ``backward``."""
        for p, view in zip(self._params, self._grad_views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
        self._client.push(self._grad)

    def close(self) -> None:
        """Waits for the pushes in flight and leaves the servers."""
        self._client.close()

    def __enter__(self) -> "ParameterServers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
