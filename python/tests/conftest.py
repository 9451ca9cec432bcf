"""Fixtures that start Capstan's real daemons (from CAPSTAN_BIN_DIR, else
build/bin) on free loopback ports and always stop them."""

import os
import pathlib
import signal
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("CAPSTAN_BIN_DIR", REPO / "build" / "bin"))
LIB_DIR = pathlib.Path(os.environ.get("CAPSTAN_LIB_DIR", BIN_DIR.parent / "lib"))
TRAINING_MODULE = str(LIB_DIR / "libcapstan_training_module.so")
TEST_MODULE = str(LIB_DIR / "libcapstan_test_module.so")


class Daemon:
    def __init__(self, process, address, http_port, log_path):
        self.process = process
        self.address = address
        self.http_port = http_port
        self.log_path = log_path

    def log(self):
        return pathlib.Path(self.log_path).read_text(errors="replace")


class Cluster:
    """Starts daemons; stop() kills every one (the fixture calls it)."""

    def __init__(self, directory):
        self.dir = pathlib.Path(directory)
        self.daemons = []

    def start(self, program, *args, timeout=15.0):
        n = len(self.daemons)
        port_file = self.dir / f"{program}-{n}.port"
        log_path = self.dir / f"{program}-{n}.log"
        command = [str(BIN_DIR / program), "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
                   "--port-file", str(port_file), *args]
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.monotonic() + timeout
        while not port_file.exists() or "pid:" not in port_file.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{program} did not start:\n{log_path.read_text()}")
            time.sleep(0.02)
        fields = dict(line.split(": ", 1) for line in port_file.read_text().splitlines() if ": " in line)
        daemon = Daemon(process, f"127.0.0.1:{fields['rpc_port']}", int(fields["http_port"]), log_path)
        self.daemons.append(daemon)
        return daemon

    def stop(self):
        for d in self.daemons:
            if d.process.poll() is None:
                d.process.send_signal(signal.SIGKILL)
        for d in self.daemons:
            d.process.wait(timeout=10)


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def wait_until(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def training(cluster):
    """A parameter server, a coordinator and two workers with the training
    module; a connected capstan.ClusterCoordinator."""
    import capstan

    ps = cluster.start("ps-server", "--task-index", "0")
    coordinator = cluster.start("coordinator", "--ps", ps.address)
    for i in range(2):
        cluster.start("worker-server", "--coordinator", coordinator.address, "--module", TRAINING_MODULE,
                      "--task-index", str(i))
    client = capstan.ClusterCoordinator.connect(coordinator.address)
    assert wait_until(lambda: client.num_workers() == 2)
    return client


@pytest.fixture
def data_service(cluster):
    """A dispatcher and one data worker; the dispatcher's address."""
    dispatcher = cluster.start("data-dispatcher")
    cluster.start("data-worker", "--dispatcher", dispatcher.address, "--module", TEST_MODULE)
    return dispatcher.address
