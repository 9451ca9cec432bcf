"""Daemons on this machine for examples and benchmarks: a data dispatcher and
data workers, or parameter servers and a coordinator, from a build's bin
directory, on free loopback ports.

    with capstan.local.DataService("build/bin", modules=["build/lib/libmy_module.so"]) as dispatcher:
        dataset_id = capstan.data.service.register_dataset(dispatcher, dataset)
    with capstan.local.ParameterServers("build/bin", ps=2) as coordinator:
        cluster = capstan.ClusterCoordinator.connect(coordinator)

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

    def _start_and_wait(self, program, *args):
        """Starts `program` and waits for its port file; its RPC address."""
        port_file = pathlib.Path(self._workdir.name) / f"{program}-{len(self.processes)}.port"
        self._start(program, "--port-file", str(port_file), *args)
        process = self.processes[-1]
        deadline = time.monotonic() + self.timeout
        while not port_file.exists() or "pid:" not in port_file.read_text():
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{self.bin_dir / program} did not start")
            time.sleep(0.05)
        fields = dict(line.split(": ", 1) for line in port_file.read_text().splitlines() if ": " in line)
        return f"127.0.0.1:{fields['rpc_port']}"

    def __enter__(self):
        self._workdir = tempfile.TemporaryDirectory()
        try:
            self.address = self._start_and_wait("data-dispatcher")
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


class ParameterServers(DataService):
    """`ps` parameter servers and a coordinator; the context's value is the
    coordinator's address (training processes connect to it and form their
    groups through it). Every process started is killed on exit."""

    def __init__(self, bin_dir, ps=1, timeout=15.0):
        super().__init__(bin_dir, timeout=timeout)
        self.ps = ps

    def __enter__(self):
        self._workdir = tempfile.TemporaryDirectory()
        try:
            servers = [self._start_and_wait("ps-server", "--task-index", str(i)) for i in range(self.ps)]
            self.address = self._start_and_wait("coordinator", *[a for s in servers for a in ("--ps", s)])
            return self.address
        except BaseException:
            self.__exit__(None, None, None)
            raise
