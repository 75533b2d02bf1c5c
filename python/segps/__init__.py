"""segps from Python: a worker of a segps job, in any framework.

``segps.Client`` pulls a segment's parameters into a NumPy array and pushes
gradients from one; ``segps.torch.ParameterServers`` binds a
``torch.nn.Module`` to a segment. Both are the C++ client underneath: the
staleness bound, recovery from server restarts, TLS and tokens behave as
in ``segps-worker`` (docs/python.md).
"""

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from ._segps import Error, Session as _Session, check_config

__all__ = ["Client", "Error", "check_config"]

Servers = Union[str, Sequence[str], None]


def _server_list(servers: Servers) -> List[str]:
    if servers is None:
        return []
    if isinstance(servers, str):
        return [s for s in servers.split(",") if s]
    return list(servers)


class Client:
    """One worker (or reader) of one segment of a job.

    Args:
        config: the job config file (*.pbtxt) the servers run with.
        servers: ``"host:port,host:port"`` or a list, in server index
            order; None: the config's ``cluster.server_addresses``.
        segment: the segment's name or index; None: the config's only one.
        rank: the worker's rank, ``"auto"`` (the lowest free one), or None
            for a reader that only pulls (evaluation) and never waits.
        tls_ca, tls_cert, tls_key, token_file: as segps-worker's
            ``--tls_ca``, ``--tls_cert``, ``--tls_key``, ``--token_file``.
        config_text: the config's text instead of a file.

    Raises:
        segps.Error: a refusal (``e.code``: ``INVALID_ARGUMENT`` for a bad
            config or rank, ``UNAVAILABLE`` for servers that did not answer
            within ``cluster.recovery_timeout_ms``, ...), with the message.
    """

    def __init__(self, config: str = "", servers: Servers = None, segment: Optional[Union[str, int]] = None,
                 rank: Union[int, str, None] = "auto", *, tls_ca: str = "", tls_cert: str = "", tls_key: str = "",
                 token_file: str = "", config_text: str = "") -> None:
        self._session = _Session(config, config_text, _server_list(servers),
                                 "" if segment is None else str(segment), None if rank is None else str(rank),
                                 tls_ca, tls_cert, tls_key, token_file)
        self._closed = False

    @property
    def size(self) -> int:
        """The segment's parameters (float32 elements)."""
        return self._session.size

    @property
    def rank(self) -> Optional[int]:
        """The worker's rank; None for a reader."""
        return self._session.rank

    @property
    def segment(self) -> str:
        return self._session.segment

    @property
    def clock(self) -> int:
        """The clock the next pull is for (and the push after it)."""
        return self._session.clock

    @property
    def steps(self) -> int:
        """Pushes the servers acknowledged since this client opened."""
        return self._session.steps

    @property
    def recoveries(self) -> int:
        """Times the client rejoined the servers after a failure."""
        return self._session.recoveries

    def tensors(self) -> List[Tuple[str, List[int], int]]:
        """(name, shape, offset) of each tensor, in the segment's flat order."""
        return self._session.tensors()

    def pull(self, out: Optional[np.ndarray] = None) -> np.ndarray:
        """The parameters, once the staleness bound allows computing
        ``clock``; into ``out`` (float32, C-contiguous, ``size`` elements)
        if given."""
        if out is None:
            out = np.empty(self.size, dtype=np.float32)
        if out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError("pull: out must be a C-contiguous float32 array")
        self._session.pull(out)
        return out

    def push(self, gradient: np.ndarray) -> None:
        """The gradient of ``clock`` (``size`` elements), computed on the
        last pull's parameters; returns once it is encoded, waiting only for
        pushes beyond the bound on those in flight."""
        self._session.push(np.ascontiguousarray(gradient, dtype=np.float32).reshape(-1))

    def close(self) -> None:
        """Waits for the pushes in flight and leaves the servers."""
        if not self._closed:
            self._closed = True
            self._session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
