"""TensorFlow's side of ps_bench: pulling a dense variable from a parameter
server into the client, pushing a value from the client into it, and the
sparse gather of embedding rows from a table
partitioned over 2 parameter servers, with tf.distribute.ParameterServerStrategy.

Cluster: 2 ps tasks and 1 worker task (tf.distribute.Server on loopback
ports, one subprocess each; --in-process puts them in this process). The
client (this process) creates, under strategy.scope():
  dense      float32[N, 256] of --mib MiB, on one ps (below the partitioner's
             minimum shard size), read into the client with read_value()
             and .numpy(): ps_bench's "pull (read_variable)", 1 ps; and
             assigned a float32 tensor of the same size held by the client
             (Variable.assign): ps_bench's "push (assign)", 1 ps
  embedding  float32[--rows, 64] (default 1M x 64 = 256 MB), in 2 shards
             (MinSizePartitioner, max 2 shards: a ShardedVariable, one shard
             on each ps), batches of 10k random ids looked up with
             tf.nn.embedding_lookup inside a tf.function on the client (the
             rows come back to it): ps_bench's "sparse gather" on 2 ps

    bench/peers/.venv/bin/python bench/peers/ps_variables.py [--mib 64] [--reps 8] [--rows 1000000] [--batches 50]

Prints RESULT ps_pull_<M>mib_1ps, ps_push_<M>mib_1ps (GB/s) and
ps_gather_10k_2ps (rows/s).
"""
import argparse
import sys
import time

import peer_common
from peer_common import result

DIM, BATCH = 64, 10000


def filled(value, shape):
    # An initial value the strategy makes on the ps itself, shard by shard
    # (it passes the shard's shape), rather than on the client.
    import tensorflow as tf

    def init(partition_shape=None, partition_offset=None):
        return tf.fill(partition_shape if partition_shape is not None else shape, tf.constant(value, tf.float32))
    return init


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64, help="dense variable size; 0: no dense pull")
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1000000, help="embedding rows; 0: no gather")
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--in-process", action="store_true", help="the ps and worker servers in this process")
    args = parser.parse_args()

    cluster = peer_common.Cluster(workers=1, ps=2, in_process=args.in_process)
    try:
        import numpy as np
        import tensorflow as tf
        # Shards of at least 100 MB, at most 2: the 64 MiB variable stays
        # whole on one ps, the 256 MB table is split over both.
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=100 << 20, max_shards=2)
        strategy = tf.distribute.ParameterServerStrategy(cluster.resolver(), variable_partitioner=partitioner)
        print(f"tensorflow {tf.__version__} ParameterServerStrategy, 2 ps, "
              f"{'in-process' if args.in_process else 'one process per task'}:")

        if args.mib > 0:
            rows = (args.mib << 20) // 4 // 256
            with strategy.scope():
                dense = tf.Variable(filled(1.0, [rows, 256]), shape=[rows, 256], dtype=tf.float32, name="dense")
            assert not hasattr(dense, "variables"), "the dense variable was partitioned"
            nbytes = rows * 256 * 4
            value = dense.read_value().numpy()  # warm up
            assert value.nbytes == nbytes and value[0, 0] == 1.0
            start = time.perf_counter()
            for _ in range(args.reps):
                value = dense.read_value().numpy()
            per_pull = (time.perf_counter() - start) / args.reps
            print(f"  pull {args.mib} MiB from {dense.device}: {nbytes / per_pull / 1e9:.2f} GB/s "
                  f"({per_pull * 1e3:.1f} ms, mean of {args.reps})")
            result(f"ps_pull_{args.mib}mib_1ps", nbytes / per_pull / 1e9, "GB/s")
            del value

            # Push: the client's tensor assigned to the variable on the ps. A
            # tensor handle keeps the copy of itself it sent to a remote device
            # and sends it only once, so each assign gets a handle of its own
            # (tf.identity: a new handle over the same local buffer). The
            # one-element read after the loop waits for the assigns (ops on a
            # device run in order), at the cost of one small round trip.
            pushed = tf.constant(np.full([rows, 256], 2.0, np.float32))
            dense.assign(tf.identity(pushed), read_value=False)  # warm up
            assert dense[0, 0].numpy() == 2.0
            handles = [tf.identity(pushed) for _ in range(args.reps)]
            start = time.perf_counter()
            for handle in handles:
                dense.assign(handle, read_value=False)
            assert dense[0, 0].numpy() == 2.0
            per_push = (time.perf_counter() - start) / args.reps
            print(f"  push {args.mib} MiB to {dense.device} (assign): {nbytes / per_push / 1e9:.2f} GB/s "
                  f"({per_push * 1e3:.1f} ms, mean of {args.reps})")
            result(f"ps_push_{args.mib}mib_1ps", nbytes / per_push / 1e9, "GB/s")

        if args.rows > 0:
            start = time.perf_counter()
            with strategy.scope():
                table = tf.Variable(filled(0.25, [args.rows, DIM]), shape=[args.rows, DIM], dtype=tf.float32,
                                    name="embedding")
            created = time.perf_counter() - start
            shards = getattr(table, "variables", [table])
            placed = ", ".join(f"{v.shape[0]} rows on {v.device}" for v in shards)

            @tf.function
            def lookup(ids):
                return tf.nn.embedding_lookup(table, ids)

            rng = np.random.default_rng(42)
            batches = [tf.constant(rng.integers(0, args.rows, BATCH, dtype=np.int64)) for _ in range(16)]
            for _ in range(3):  # trace and warm up
                rows = lookup(batches[0]).numpy()
            assert rows.shape == (BATCH, DIM) and rows[0, 0] == 0.25
            latencies = []
            start = time.perf_counter()
            for b in range(args.batches):
                t0 = time.perf_counter()
                lookup(batches[b % len(batches)]).numpy()
                latencies.append((time.perf_counter() - t0) * 1e3)
            total = time.perf_counter() - start
            latencies.sort()
            print(f"  sparse gather: float32[{args.rows}, {DIM}] in {len(shards)} shard(s) ({placed}; "
                  f"created in {created:.2f} s)")
            p50, p99 = peer_common.percentile(latencies, 0.5), peer_common.percentile(latencies, 0.99)
            print(f"    {args.batches} batches of {BATCH} random ids, tf.nn.embedding_lookup in a tf.function: "
                  f"{args.batches * BATCH / total:.0f} rows/s, batch p50 {p50:.2f} ms  p99 {p99:.2f} ms")
            result(f"ps_gather_10k_{len(shards)}ps", args.batches * BATCH / total, "rows/s")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
