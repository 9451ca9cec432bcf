"""Daemons on this machine for examples and benchmarks: a data dispatcher and
data workers from a build's bin directory, on free loopback ports.

    with capstan.local.DataService("build/bin", modules=["build/lib/libmy_module.so"]) as dispatcher:
        dataset_id = capstan.data.service.register_dataset(dispatcher, dataset)

Production clusters run the daemons under systemd, Kubernetes or
scripts/local-cluster.sh; this is for a program that wants its own.
"""

import pathlib
import subprocess
import tempfile
import time


class DataService:
    """A dispatcher and `workers` data workers; the context's value is the
    dispatcher's address. Every process started is killed on exit, also when
    a start fails."""

    def __init__(self, bin_dir, modules=(), workers=1, timeout=15.0):
        self.bin_dir = pathlib.Path(bin_dir)
        self.modules = list(modules)
        self.workers = workers
        self.timeout = timeout
        self.processes = []
        self._workdir = None

    def _start(self, program, *args):
        self.processes.append(subprocess.Popen([str(self.bin_dir / program), "--port", "0", "--http-port", "0", *args],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def __enter__(self):
        self._workdir = tempfile.TemporaryDirectory()
        try:
            port_file = pathlib.Path(self._workdir.name) / "dispatcher.port"
            self._start("data-dispatcher", "--port-file", str(port_file))
            deadline = time.monotonic() + self.timeout
            while not port_file.exists() or "pid:" not in port_file.read_text():
                if time.monotonic() > deadline or self.processes[0].poll() is not None:
                    raise RuntimeError(f"the data dispatcher ({self.bin_dir / 'data-dispatcher'}) did not start")
                time.sleep(0.05)
            fields = dict(line.split(": ", 1) for line in port_file.read_text().splitlines() if ": " in line)
            self.address = f"127.0.0.1:{fields['rpc_port']}"
            module_args = [arg for m in self.modules for arg in ("--module", str(m))]
            for _ in range(self.workers):
                self._start("data-worker", "--dispatcher", self.address, *module_args)
            return self.address
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        for p in self.processes:
            p.kill()
            p.wait()
        self.processes = []
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        return False
