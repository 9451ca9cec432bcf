"""TensorFlow's side of pipeline_bench's parse_example workload.

Batches of 256 tf.train.Examples, each 4 int64 scalars ("i0".."i3") and a
float[16] ("f"), parsed with tf.io.parse_example inside a tf.function (no
Python per Example), one thread for the op as Capstan's bench uses (--threads 0: TF's default); prints
the median examples/s of several passes over 100 batches (and the line
`RESULT parse_example_256 <examples/s> examples/s` for bench/compare).

    bench/peers/venv.sh                       # once: TensorFlow from PyPI
    bench/peers/.venv/bin/python bench/peers/parse_example.py [--passes 5]
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

BATCHES, BATCH = 100, 256


def make_batches():
    batches = []
    for b in range(BATCHES):
        serialized = []
        for e in range(BATCH):
            feature = {f"i{k}": tf.train.Feature(int64_list=tf.train.Int64List(value=[b * 1000003 + e * 31 + k]))
                       for k in range(4)}
            feature["f"] = tf.train.Feature(float_list=tf.train.FloatList(value=[0.25 * (e + k) for k in range(16)]))
            serialized.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        batches.append(tf.constant(serialized))
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="TF intra-op threads (0: TF's default)")
    args = parser.parse_args()
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    spec = {f"i{k}": tf.io.FixedLenFeature([], tf.int64) for k in range(4)}
    spec["f"] = tf.io.FixedLenFeature([16], tf.float32)

    # Every batch parsed inside one graph (a while loop), so that no Python
    # runs between batches; the checksum keeps the outputs live.
    @tf.function
    def parse_all(stacked):
        checksum = tf.constant(0, tf.int64)
        for b in tf.range(BATCHES):
            out = tf.io.parse_example(stacked[b], spec)
            checksum += out["i0"][0] + tf.cast(out["f"][0, 0], tf.int64)
        return checksum

    batches = make_batches()
    example_bytes = sum(len(s) for s in batches[0].numpy()) // BATCH
    stacked = tf.stack(batches)
    parse_all(stacked)  # trace and warm up
    rates = []
    for _ in range(args.passes):
        start = time.perf_counter()
        parse_all(stacked).numpy()
        rates.append(BATCHES * BATCH / (time.perf_counter() - start))
    print(f"tensorflow {tf.__version__} tf.io.parse_example, {BATCH} x (4 int64 + float[16]), "
          f"{example_bytes} bytes each, {args.threads or 'default'} thread(s), median of {args.passes}: {statistics.median(rates):.0f} examples/s")
    # The machine-readable line bench/compare reads (pipeline_bench prints the same name).
    print(f"RESULT parse_example_256 {statistics.median(rates):.6g} examples/s")


if __name__ == "__main__":
    main()
