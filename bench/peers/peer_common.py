"""What the TensorFlow peer scripts share: quiet TensorFlow logs, free
loopback ports, the one machine-readable line per figure, and a small
cluster of tf.distribute.Server tasks (one subprocess per task, on loopback
ports, like Capstan's daemons; or in this process with in_process=True, as
TF's own ParameterServerStrategy tutorial does).

Every figure a script measures is printed as

    RESULT <workload> <value> <unit>

(the names are the ones Capstan's benches print for the same workload), so
that bench/compare can put the two side by side. Written from TensorFlow's
public API; nothing here is a dependency of Capstan.
"""
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def result(workload, value, unit):
    """Prints the machine-readable line bench/compare reads."""
    print(f"RESULT {workload} {value:.6g} {unit}", flush=True)


def percentile(sorted_values, fraction):
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * fraction))]


class Cluster:
    """`workers` worker tasks and `ps` parameter-server tasks on 127.0.0.1.

    With in_process=False (the default) every task is a subprocess running
    `peer_common.py serve ...`; it lives until this object's stop() or until
    this process ends (the task exits when its stdin closes).
    """

    def __init__(self, workers, ps, in_process=False):
        self.spec = {}
        if workers:
            self.spec["worker"] = [f"127.0.0.1:{free_port()}" for _ in range(workers)]
        if ps:
            self.spec["ps"] = [f"127.0.0.1:{free_port()}" for _ in range(ps)]
        self.procs = []
        self.servers = []
        if in_process:
            import tensorflow as tf
            for job, tasks in self.spec.items():
                for index in range(len(tasks)):
                    self.servers.append(tf.distribute.Server(
                        tf.train.ClusterSpec(self.spec), job_name=job, task_index=index, protocol="grpc", start=True))
            return
        for job, tasks in self.spec.items():
            for index in range(len(tasks)):
                self.procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "serve", json.dumps(self.spec), job, str(index)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for proc in self.procs:  # each says "ready" once its server has started
            line = proc.stdout.readline()
            if line.strip() != "ready":
                self.stop()
                raise RuntimeError("a tf.distribute.Server task did not start (its error is above)")

    def resolver(self):
        import tensorflow as tf
        return tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(self.spec), rpc_layer="grpc")

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.stdin.close()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


def serve(spec_json, job, index):
    import tensorflow as tf
    tf.distribute.Server(tf.train.ClusterSpec(json.loads(spec_json)), job_name=job, task_index=int(index),
                         protocol="grpc", start=True)
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes our stdin or ends
    os._exit(0)  # a Server cannot be stopped cleanly; leave without waiting for its threads


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "serve":
        serve(*sys.argv[2:])
    else:
        print("usage: peer_common.py serve CLUSTER_JSON JOB INDEX", file=sys.stderr)
        sys.exit(2)
