"""TensorFlow's side of collective_bench: all-reduce (SUM, float32) between
2 processes on this host with MultiWorkerMirroredStrategy (CPU: TF's RING
collectives over gRPC), timed like collective_bench: the median of several
calls per size, algbw = bytes / time, busbw = algbw * 2(n-1)/n.

    bench/peers/.venv/bin/python bench/peers/collective_all_reduce.py [--max-bytes 67108864]

Written from TF's public API (tf.distribute); run `bash bench/peers/venv.sh`
first. The figures go beside `build/bin/collective_bench --ranks 2`.
"""
import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iterations_for(size):
    if size <= 64 << 10:
        return 100
    if size <= 4 << 20:
        return 20
    return 6


def worker(index, ports, max_bytes, queue):
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    })
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    def replica_fn(x):
        # Made inside the replica's device scope: all_reduce reduces to the
        # value's device, which a plain argument does not have.
        value = tf.identity(x)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)

    @tf.function
    def reduce(x):
        return strategy.run(replica_fn, args=(x,))

    lines = []
    size = 4
    while size <= max_bytes:
        x = tf.ones([size // 4], tf.float32)
        times = []
        for i in range(iterations_for(size) + 2):
            start = time.perf_counter()
            result = reduce(x)
            value = strategy.experimental_local_results(result)[0].numpy()
            if i >= 2:
                times.append(time.perf_counter() - start)
        assert value[0] == len(ports), value[0]
        p50 = statistics.median(times)
        algbw = size / p50 / 1e9
        n = len(ports)
        lines.append(f"{'tf_all_reduce':<14} {n:5d} {size:12d} {p50 * 1e6:12.1f} {algbw:10.3f} {algbw * 2 * (n - 1) / n:10.3f}")
        size *= 4
    if index == 0:
        queue.put(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    ports = [free_port() for _ in range(args.ranks)]
    queue = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(i, ports, args.max_bytes, queue)) for i in range(args.ranks)]
    for p in procs:
        p.start()
    lines = None
    while lines is None:
        try:
            lines = queue.get(timeout=1)
        except Exception:  # queue.Empty: is everyone still running?
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.terminate()
                print("collective_all_reduce.py: a TensorFlow worker failed (its error is above)", file=sys.stderr)
                return 1
    for p in procs:
        p.join()
    print("# TensorFlow MultiWorkerMirroredStrategy, RING (gRPC) on loopback; times are medians")
    print(f"{'op':<14} {'ranks':>5} {'bytes':>12} {'p50_us':>12} {'algbw_GB/s':>10} {'busbw_GB/s':>10}")
    for line in lines:
        print(line)
    return 0 if all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
