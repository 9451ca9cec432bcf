"""TensorFlow's side of closure_bench: trivial closures per second and the
latency of one closure from schedule() to fetch(), with
tf.distribute.ParameterServerStrategy and
tf.distribute.coordinator.ClusterCoordinator.

Cluster: 1 ps task and 2 worker tasks (tf.distribute.Server on loopback
ports, one subprocess each, like closure_bench's ps-server and
worker-servers; --in-process puts them in this process, as TF's tutorial
does). TF's coordinator keeps one closure in flight per worker: this is
closure_bench's "2 workers x 1" row.

  throughput  schedule N trivial tf.functions back to back, then join()
  latency     schedule one, fetch() it; one at a time; p50/p99

    bench/peers/.venv/bin/python bench/peers/closures.py [--workers 2] [--closures 3000] [--latency-samples 500]

Prints RESULT closures_per_s_<W>x1 and schedule_fetch_p50_<W>x1 / _p99_.
"""
import argparse
import sys
import time

import peer_common
from peer_common import result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--closures", type=int, default=3000)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--in-process", action="store_true", help="the ps and worker servers in this process")
    args = parser.parse_args()

    cluster = peer_common.Cluster(workers=args.workers, ps=1, in_process=args.in_process)
    try:
        import tensorflow as tf
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

        @tf.function
        def noop():
            return tf.constant(0, tf.int64)

        def throughput(n):
            start = time.perf_counter()
            for _ in range(n):
                coordinator.schedule(noop)
            scheduled = time.perf_counter() - start
            coordinator.join()
            return scheduled, time.perf_counter() - start

        throughput(200)  # traces noop, warms the workers
        scheduled, total = throughput(args.closures)
        latencies = []
        for i in range(args.latency_samples + 50):
            start = time.perf_counter()
            coordinator.schedule(noop).fetch()
            if i >= 50:  # the first 50 warm up
                latencies.append((time.perf_counter() - start) * 1e6)
        latencies.sort()
        p50, p99 = peer_common.percentile(latencies, 0.5), peer_common.percentile(latencies, 0.99)
        print(f"tensorflow {tf.__version__} ClusterCoordinator, {args.workers} workers x 1 in flight, 1 ps, "
              f"{'in-process' if args.in_process else 'one process per task'}:")
        print(f"  {args.closures / total:.0f} closures/s ({args.closures} closures: schedule {scheduled * 1e3:.0f} ms"
              f" | join after {(total - scheduled) * 1e3:.0f} ms)")
        print(f"  schedule->fetch latency p50 {p50:.0f} us  p99 {p99:.0f} us ({len(latencies)} samples)")
        result(f"closures_per_s_{args.workers}x1", args.closures / total, "closures/s")
        result(f"schedule_fetch_p50_{args.workers}x1", p50, "us")
        result(f"schedule_fetch_p99_{args.workers}x1", p99, "us")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
