"""Parameter servers on this machine, for examples and tests.

    with segps.local.Servers("job.pbtxt") as servers:
        ps = segps.torch.ParameterServers(model, "job.pbtxt", servers.addresses)

Each server is a ``segps-server`` process on a free loopback port (from
``bin_dir``, ``$SEGPS_BIN_DIR``, or the build tree beside this package).
Serving other hosts, tokens and TLS are as in docs/deploying.md.
"""

import os
import signal
import subprocess
import threading
from typing import List, Optional, Sequence

__all__ = ["Servers"]


def _bin_dir(bin_dir: Optional[str]) -> str:
    if bin_dir:
        return bin_dir
    if os.environ.get("SEGPS_BIN_DIR"):
        return os.environ["SEGPS_BIN_DIR"]
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bin")


class Servers:
    """``num_servers`` segps-server processes for the job ``config``.

    Args:
        config: the job config file.
        num_servers: how many (the config's cluster.num_servers).
        checkpoint_dir: where they checkpoint (None: no checkpoints).
        bin_dir: where segps-server is.
        server_args: more flags for every server (``--tls_cert``, ``--token_file``, ...).
    """

    def __init__(self, config: str, num_servers: int, checkpoint_dir: Optional[str] = None,
                 bin_dir: Optional[str] = None, server_args: Sequence[str] = ()) -> None:
        self._config = config
        self._checkpoint_dir = checkpoint_dir
        self._server_args = list(server_args)
        self._binary = os.path.join(_bin_dir(bin_dir), "segps-server")
        if not os.access(self._binary, os.X_OK):
            raise FileNotFoundError("no segps-server at %s (give bin_dir or set SEGPS_BIN_DIR)" % self._binary)
        self._processes: List[Optional[subprocess.Popen]] = [None] * num_servers
        self._drains: List[Optional[threading.Thread]] = [None] * num_servers
        self.addresses: List[str] = ["127.0.0.1:0"] * num_servers
        try:
            for i in range(num_servers):
                self.start(i)
        except BaseException:
            self.close()
            raise

    def start(self, index: int) -> None:
        """Starts server ``index`` (again: on its address, restoring its
        newest checkpoint)."""
        command = [self._binary, "--config", self._config, "--index", str(index), "--listen", self.addresses[index]]
        if self._checkpoint_dir:
            command += ["--checkpoint_dir", self._checkpoint_dir]
        command += self._server_args
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self._processes[index] = process
        prefix = "segps-server listening on "
        for line in process.stdout:
            if line.startswith(prefix):
                self.addresses[index] = line[len(prefix):].strip()
                # Whatever else it prints must not fill the pipe and stall it.
                drain = threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True)
                drain.start()
                self._drains[index] = drain
                return
        raise RuntimeError("segps-server %d exited with status %s before listening" % (index, process.wait()))

    def kill(self, index: int) -> None:
        """Kills server ``index`` (SIGKILL) and waits for it."""
        if self._processes[index] is not None:
            self._processes[index].send_signal(signal.SIGKILL)
            self._reap(index)

    def close(self) -> None:
        """Stops every server (SIGTERM, then waits)."""
        for index, process in enumerate(self._processes):
            if process is not None:
                process.terminate()
                self._reap(index)

    def _reap(self, index: int) -> None:
        process, drain = self._processes[index], self._drains[index]
        process.wait()
        if drain is not None:
            drain.join()
        process.stdout.close()
        self._processes[index] = self._drains[index] = None

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
