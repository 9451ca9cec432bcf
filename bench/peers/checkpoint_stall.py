"""TensorFlow's side of bench/checkpoint_stall_bench (issue 34's stall): what
periodic checkpoints cost a training job under
tf.distribute.ParameterServerStrategy: a CTR model trains on 2 workers while
a --mib MiB float32 ballast variable sits on the 2 parameter servers, with
and without the client saving a checkpoint every --every seconds.

    bench/peers/.venv/bin/python bench/peers/checkpoint_stall.py [--mib 1024] [--every 10] [--steps 12000] \
        [--runs 3] [--window 64] [--dir DIR]

Each run is a subprocess of this script with a fresh cluster (2 ps, 2
workers: tf.distribute.Server tasks on loopback ports, one subprocess each,
peer_common.Cluster); runs alternate between no checkpoints and
checkpoints. A run:
  - creates, under strategy.scope(), the CTR weights float32[40001, 1] (4
    fields x 10,000 hashed ids + a bias row, zeros) in 2 shards (one per ps,
    FixedShardsPartitioner(2), as Capstan's fixed_shards(2)) with an Adagrad
    accumulator (0.1) beside each shard, and the ballast
    float32[--mib MiB / 4 KiB, 1024] in 2 shards, each made on its ps by a
    uniform(-1, 1) initializer (Capstan: Initializer::random_uniform(-1, 1, 7))
  - trains logistic regression (examples/ctr: the batch's rows gathered,
    summed log-loss, sparse Adagrad, learning rate 0.2, applied on the ps)
    on batches of 256 synthetic examples made by a per-worker dataset
    (ClusterCoordinator.create_per_worker_dataset): 4 fields, each a
    log-uniform raw category of 1M hashed into 10,000 buckets, labels drawn
    from a planted logistic model, as examples/ctr/planted_model.h
  - after --warmup untimed steps, schedules --steps steps with
    ClusterCoordinator.schedule, at most --window (64, ctr's kInFlight) in
    flight; a watcher thread fetches each step's loss in order (ctr fetches
    every step's loss too) and notes when it came
  - with checkpoints: every --every s (the first --every s after the timed
    steps start) the scheduling loop calls tf.train.CheckpointManager.save()
    (tf.train.Checkpoint of the weights, the accumulators and the ballast,
    max_to_keep=2 as ctr's --checkpoint-max-to-keep 2) into --dir/run-N-ckpt
    on disk. save() blocks the client thread: nothing new is scheduled while
    it runs; the closures already queued (up to --window) go on running on
    the workers, and the workers idle once those are done. TF saves each
    ps's shards with a SaveV2 placed on that ps (the ps writes its files),
    then merges the index on the client.
Figures: examples/s = timed steps x 256 / (first schedule to the last
step's completion), the median of --runs per setting, % lost; per save, the
client's wall time in save() (it includes the retrace of TF's save function,
which multi-task saves redo at every save) and the training-visible pause:
the longest gap between two consecutive step completions that overlaps the
save; p50 and max over all saves. The noise floor beside it: the same
measure in the runs without checkpoints, over windows as long as the median
save, at the times the saves would have started.

What differs from Capstan's bench:
  - Capstan's coordinator saves on its own timer, pauses dispatch only to
    snapshot (variables and the per-worker iterators' positions), and writes
    the files while training goes on; here the client's save() is the
    pause, for as long as the ps take to write their shards (minus the
    queued window), and the per-worker iterators are not saved (TF cannot
    checkpoint ClusterCoordinator's per-worker iterators).
  - TF does not stop the queued closures during the save: the saved
    variables may mix updates from before and during the save (Capstan's
    snapshot is consistent).
  - The data: the same generator's shape (4 fields, log-uniform over 1M raw
    categories, 10,000 buckets each, planted logistic labels), but the hash
    is a multiplicative one and the random numbers are TF's stateless ones
    seeded from a per-worker random stream, not planted_model.h's SplitMix64
    of the example index; the workers' streams are not disjoint shards of
    one sequence (PSS does not tell dataset_fn which worker runs it).
  - Loss/gradient in TF ops with tf.GradientTape over the gathered rows,
    repeated ids summed (tf.unique) before ResourceSparseApplyAdagradV2 on
    each shard's ps, as census_ps.py does.
Prints figures and RESULT lines; never fails on them.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import deque

import peer_common
from peer_common import result

FIELDS, BUCKETS, RAW_CATEGORIES, BATCH = 4, 10000, 1000000, 256
BIAS_ID = FIELDS * BUCKETS
VOCABULARY = BIAS_ID + 1
PLANTED_BIAS, PLANTED_STDDEV = -1.1, 0.6
LEARNING_RATE, INITIAL_ACCUMULATOR = 0.2, 0.1
BALLAST_COLUMNS = 1024


def one_run(args):
    """One cluster, one setting; returns a dict of what it measured."""
    cluster = peer_common.Cluster(workers=2, ps=2)
    try:
        import numpy as np
        import tensorflow as tf
        # TF's multi-task save retraces its save function at every save (by
        # design, functional_saver.py) and warns each time; the retrace is part
        # of save()'s time here, the warnings are not printed.
        tf.get_logger().setLevel("ERROR")

        strategy = tf.distribute.ParameterServerStrategy(
            cluster.resolver(), variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2))
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

        def shards(v):
            return list(v.variables) if hasattr(v, "variables") else [v]

        ballast_rows = (args.mib << 20) // (BALLAST_COLUMNS * 4)
        start = time.perf_counter()
        with strategy.scope():
            def zeros(partition_shape=None, partition_offset=None):
                return tf.zeros(partition_shape if partition_shape is not None else [VOCABULARY, 1])
            weights = tf.Variable(zeros, shape=[VOCABULARY, 1], dtype=tf.float32, name="ctr_weights")
            accumulators = []
            for s in shards(weights):
                with strategy.extended.colocate_vars_with(s):
                    accumulators.append(tf.Variable(tf.fill(s.shape, INITIAL_ACCUMULATOR), trainable=False,
                                                    name=f"{s.name.split(':')[0]}/accumulator"))

            def uniform(partition_shape=None, partition_offset=None):
                # Made on the ps that holds the shard (the strategy passes its shape).
                shape = partition_shape if partition_shape is not None else [ballast_rows, BALLAST_COLUMNS]
                return tf.random.uniform(shape, -1.0, 1.0, seed=7)
            ballast = tf.Variable(uniform, shape=[ballast_rows, BALLAST_COLUMNS], dtype=tf.float32, name="ballast",
                                  trainable=False)
        ballast_placed = ", ".join(f"{v.shape[0]} rows on {v.device.split('/device')[0]}" for v in shards(ballast))
        # A one-element read per shard waits for the initializers (ops on a device run in order).
        for v in shards(ballast):
            v[0, 0].numpy()
        created = time.perf_counter() - start

        planted = tf.constant(np.concatenate([
            np.random.default_rng(1).normal(0, PLANTED_STDDEV, BIAS_ID), [PLANTED_BIAS]]).astype(np.float32))
        log_range = math.log(RAW_CATEGORIES + 1.0)

        def make_batch(seed):
            # 256 examples from a stateless seed: per field a log-uniform raw
            # category in [0, 1M), hashed into 10,000 buckets; a label drawn
            # from the planted logistic model over the example's ids.
            seeds = tf.stack([seed, tf.constant(0, tf.int64)])
            u = tf.random.stateless_uniform([BATCH, FIELDS], seed=seeds, dtype=tf.float64)
            raw = tf.clip_by_value(tf.cast(tf.exp(u * log_range), tf.int64) - 1, 0, RAW_CATEGORIES - 1)
            field = tf.range(FIELDS, dtype=tf.int64)[tf.newaxis, :]
            hashed = tf.math.floormod(raw * 2654435761 + field * 40503 + 12345, 1 << 32)
            ids = field * BUCKETS + tf.math.floormod(hashed, BUCKETS)
            logit = PLANTED_BIAS + tf.reduce_sum(tf.gather(planted, ids), axis=1)
            draw = tf.random.stateless_uniform([BATCH], seed=seeds + [0, 1])
            label = tf.cast(draw < tf.sigmoid(logit), tf.float32)
            return ids, label

        def dataset_fn():
            return (tf.data.Dataset.random()  # a random stream per worker: the batches' seeds
                    .map(make_batch, num_parallel_calls=tf.data.AUTOTUNE)
                    .prefetch(tf.data.AUTOTUNE))

        per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
        learning_rate = tf.constant(LEARNING_RATE, tf.float32)
        epsilon = tf.constant(1e-7, tf.float32)

        def replica_step(ids, label):
            all_ids = tf.concat([ids, tf.fill([BATCH, 1], tf.constant(BIAS_ID, tf.int64))], axis=1)
            weight_shards = shards(weights)
            with tf.GradientTape() as tape:
                rows = tf.nn.embedding_lookup(weights, all_ids)  # [256, 5, 1]
                logit = tf.reduce_sum(rows, axis=[1, 2])
                # The batch's summed log-loss (ctr sums, not averages).
                loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
            for s, acc, g in zip(weight_shards, accumulators, tape.gradient(loss, weight_shards)):
                with tf.device(s.device):
                    unique, position = tf.unique(g.indices)
                    values = tf.math.unsorted_segment_sum(g.values, position, tf.size(unique))
                    tf.raw_ops.ResourceSparseApplyAdagradV2(var=s.handle, accum=acc.handle, lr=learning_rate,
                                                            epsilon=epsilon, grad=values, indices=unique)
            return loss / BATCH

        @tf.function
        def train_step(iterator):
            ids, label = next(iterator)
            return strategy.run(replica_step, args=(ids, label))

        start = time.perf_counter()
        for _ in range(args.warmup):
            coordinator.schedule(train_step, args=(per_worker_iterator,))
        coordinator.join()
        warmup_seconds = time.perf_counter() - start

        manager = None
        if args.every > 0:
            checkpoint = tf.train.Checkpoint(weights=weights, accumulators=accumulators, ballast=ballast)
            manager = tf.train.CheckpointManager(checkpoint, args.ckpt_dir, max_to_keep=2)

        # The watcher fetches the steps' losses in order and notes when each came.
        lock = threading.Condition()
        pending = deque()
        completions = []  # time of each step's completion, in order
        losses = []
        errors = []
        finished = []  # set once the scheduling loop is done

        def watch():
            while True:
                with lock:
                    while not pending and not finished:
                        lock.wait()
                    if not pending:
                        return
                    value = pending.popleft()
                try:
                    loss = float(value.fetch())
                except Exception as e:  # noqa: BLE001 -- reported, not raised, in this thread
                    errors.append(repr(e))
                    loss = float("nan")
                now = time.perf_counter()
                with lock:
                    completions.append(now)
                    losses.append(loss)
                    lock.notify_all()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        saves = []  # (start, end) of each save, client's clock
        start = time.perf_counter()
        next_save = start + args.every if manager else math.inf
        scheduled = 0
        while scheduled < args.steps:
            if time.perf_counter() >= next_save:
                s0 = time.perf_counter()
                manager.save(checkpoint_number=len(saves) + 1)
                s1 = time.perf_counter()
                saves.append((s0, s1))
                next_save = max(s0 + args.every, s1)
            with lock:
                while scheduled - len(completions) >= args.window and not errors:
                    lock.wait(timeout=max(0.001, min(1.0, next_save - time.perf_counter())))
                    if time.perf_counter() >= next_save:
                        break
                if errors:
                    break
                if scheduled - len(completions) >= args.window:
                    continue  # a save is due
            value = coordinator.schedule(train_step, args=(per_worker_iterator,))
            with lock:
                pending.append(value)
                lock.notify_all()
            scheduled += 1
        with lock:
            finished.append(True)
            lock.notify_all()
        watcher.join()
        try:
            coordinator.join()
        except Exception as e:  # noqa: BLE001 -- reported below with the figures
            errors.append(repr(e))
        seconds = completions[-1] - start if completions else float("nan")
        if errors:
            print(f"checkpoint_stall.py: a step failed: {errors[0]}", file=sys.stderr)

        gaps = [b - a for a, b in zip(completions, completions[1:])]
        pauses, during = [], []
        for s0, s1 in saves:
            overlapping = [b - a for a, b in zip(completions, completions[1:]) if b > s0 and a < s1]
            pauses.append(max(overlapping) if overlapping else s1 - s0)
            during.append(sum(1 for t in completions if s0 <= t <= s1))
        tail = losses[-min(len(losses), 2000):]
        return {
            "tf": tf.__version__,
            "examples_per_second": len(completions) * BATCH / seconds,
            "seconds": seconds,
            "warmup_seconds": warmup_seconds,
            "ballast_seconds": created,
            "ballast_placed": ballast_placed,
            "saves_ms": [(s1 - s0) * 1e3 for s0, s1 in saves],
            "pauses_ms": [p * 1e3 for p in pauses],
            "steps_during_save": during,
            "completions": [round(t - start, 6) for t in completions],
            "median_gap_ms": statistics.median(gaps) * 1e3 if gaps else float("nan"),
            "max_gap_ms": max(gaps) * 1e3 if gaps else float("nan"),
            "loss": statistics.fmean(tail) if tail else float("nan"),
            "errors": len(errors),
        }
    finally:
        cluster.stop()


def median(values):
    return statistics.median(values) if values else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="ballast variable size (MiB)")
    parser.add_argument("--every", type=int, default=10, help="seconds between checkpoints")
    parser.add_argument("--steps", type=int, default=3000,
                        help="timed steps of 256 examples per run (3000: 40-50 s on a busy 2-core machine)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed steps first (tracing)")
    parser.add_argument("--runs", type=int, default=3, help="runs per setting")
    parser.add_argument("--window", type=int, default=64, help="scheduled steps in flight at most")
    parser.add_argument("--dir", default="/tmp/capstan-tf-checkpoint-stall",
                        help="checkpoint directory (on disk, not tmpfs)")
    parser.add_argument("--one-run", help=argparse.SUPPRESS)  # internal: a child run's tag
    parser.add_argument("--ckpt-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.mib, args.steps, args.runs, args.window) < 1 or args.every < 0:
        print("checkpoint_stall.py: --mib, --steps, --runs and --window must be at least 1", file=sys.stderr)
        return 2

    if args.one_run:
        print("RUN " + json.dumps(one_run(args)), flush=True)
        return 0

    import shutil
    os.makedirs(args.dir, exist_ok=True)
    print(f"checkpoint_stall.py: CTR on 2 workers, 2 ps, + a {args.mib} MiB variable; checkpoints every "
          f"{args.every} s into {args.dir}; {args.steps} steps of {BATCH} per run ({os.cpu_count()} cores)",
          flush=True)

    def child(tag, every):
        ckpt_dir = os.path.join(args.dir, f"run-{tag}")
        command = [sys.executable, os.path.abspath(__file__), "--one-run", tag, "--ckpt-dir", ckpt_dir,
                   "--mib", str(args.mib), "--every", str(every), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--window", str(args.window)]
        out = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        for line in out.stdout.splitlines():
            if line.startswith("RUN "):
                return json.loads(line[4:])
        print(f"checkpoint_stall.py: run {tag} exited {out.returncode} without figures:\n{out.stdout}",
              file=sys.stderr)
        return None

    without, with_, pauses, saves, during, quiet_runs, rates = [], [], [], [], [], [], []
    first = None
    for run in range(1, args.runs + 1):
        none = child(f"{run}-none", 0)
        ckpt = child(f"{run}-ckpt", args.every)
        if first is None:
            first = none or ckpt
            if first:
                print(f"  tensorflow {first['tf']} ParameterServerStrategy + ClusterCoordinator; ballast: "
                      f"{first['ballast_placed']} (made in {first['ballast_seconds']:.1f} s)")
        if none:
            without.append(none["examples_per_second"])
            quiet_runs.append(none["completions"])
            rates.append(none["examples_per_second"] / BATCH)
        if ckpt:
            with_.append(ckpt["examples_per_second"])
            pauses += ckpt["pauses_ms"]
            saves += ckpt["saves_ms"]
            during += ckpt["steps_during_save"]
        describe = []
        for name, r in (("without checkpoints", none), ("with", ckpt)):
            failed = f", {r['errors']} steps failed" if r and r["errors"] else ""
            describe.append(f"{r['examples_per_second']:.0f} examples/s {name} ({r['seconds']:.1f} s, "
                            f"loss {r['loss']:.4f}{failed})" if r else f"no figure {name}")
        saves_text = (f"; {len(ckpt['saves_ms'])} saves: "
                      + ", ".join(f"{s:.0f} ms (pause {p:.0f})" for s, p in zip(ckpt["saves_ms"], ckpt["pauses_ms"]))
                      if ckpt else "")
        floor_text = (f"; step gaps without: median {none['median_gap_ms']:.1f} ms, max {none['max_gap_ms']:.0f} ms"
                      if none else "")
        print(f"  run {run}: {', '.join(describe)}{saves_text}{floor_text}", flush=True)

    a, b = median(without), median(with_)
    lost = 100.0 * (1 - b / a) if without and with_ else float("nan")
    print(f"\nexamples/s, median of {args.runs} runs: {a:.0f} without, {b:.0f} with checkpoints every "
          f"{args.every} s ({lost:.1f}% lost)")
    if pauses:
        pauses.sort()
        print(f"training pause per save over {len(pauses)} saves (longest gap between step completions that "
              f"overlaps the save): p50 {median(pauses):.1f} ms, max {pauses[-1]:.1f} ms; save() took "
              f"{median(saves):.0f} ms (median, max {max(saves):.0f}); steps completed during a save: median "
              f"{median(during):.0f} (of at most {args.window} queued)")
    if quiet_runs and saves:
        # The noise floor: the same measure in the runs without checkpoints,
        # over windows as long as the median save at the times saves would
        # have started (every --every s).
        length, floor = median(saves) / 1e3, []
        for times in quiet_runs:
            k = 1
            while k * args.every + length < times[-1]:
                s0, s1 = k * args.every, k * args.every + length
                gaps = [b - a for a, b in zip(times, times[1:]) if b > s0 and a < s1]
                floor.append(max(gaps) * 1e3 if gaps else length * 1e3)
                k += 1
        if floor:
            floor.sort()
            print(f"noise floor: the same measure in the runs without checkpoints, over {len(floor)} windows of "
                  f"{length * 1e3:.0f} ms at the same times: p50 {median(floor):.1f} ms, max {floor[-1]:.1f} ms")
    if rates:
        print(f"the {args.window} steps queued when a save starts are {args.window / median(rates) * 1e3:.0f} ms "
              f"of training at {median(rates):.0f} steps/s (the runs without checkpoints)")
    result("checkpoint_stall_examples_per_second_without", a, "examples/s")
    result("checkpoint_stall_examples_per_second_with", b, "examples/s")
    result("checkpoint_stall_throughput_lost", lost, "%")
    if pauses:
        result("checkpoint_stall_pause_p50", median(pauses), "ms")
        result("checkpoint_stall_pause_max", pauses[-1], "ms")
        result("checkpoint_stall_save", median(saves), "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
