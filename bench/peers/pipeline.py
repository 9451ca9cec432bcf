"""TensorFlow's side of pipeline_bench's tfrecord and shuffle sections.

  tfrecord  a file of --records records of 1000 bytes (written here with
            tf.io.TFRecordWriter), read 5 times with
            tf.data.TFRecordDataset(file).repeat(5) from the page cache;
            GB/s of record bytes
  shuffle   tf.data.Dataset.range(2M).shuffle(10000, seed=1).batch(256)
            .prefetch(AUTOTUNE); input elements/s

Both run with TF's tf.data autotuning off (--autotune: on, TF's default),
which is faster on this 2-core machine: the fairer figure for TF.
Each dataset is drained inside TensorFlow (Dataset.reduce in a tf.function:
a loop in the runtime, no Python per element), as pipeline_bench drains its
own in C++; the records in batches of 1024, since TF's reduce calls its
function once per element and that call costs far more than reading a record.
(parse_example is its own script, parse_example.py: it sets TF's op threads
to 1 for the whole process.)

    bench/peers/.venv/bin/python bench/peers/pipeline.py [--only tfrecord,shuffle] [--records 200000] [--dir DIR]

Prints RESULT tfrecord_read_1000b (GB/s) and shuffle10000_batch256 (elements/s).
"""
import argparse
import os
import sys
import tempfile
import time

from peer_common import result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="tfrecord,shuffle")
    parser.add_argument("--records", type=int, default=200000)
    parser.add_argument("--elements", type=int, default=2000000, help="shuffle: range(N)")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--autotune", action="store_true", help="leave TF's tf.data autotuning on (TF's default)")
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    import numpy as np
    import tensorflow as tf
    # TF's autotuner off unless --autotune: on 2 cores its thread costs these
    # pipelines a third to a half of their rate (measured), and they have
    # nothing for it to tune but the prefetch buffer.
    options = tf.data.Options()
    options.autotune.enabled = args.autotune
    print(f"tensorflow {tf.__version__} tf.data on {os.cpu_count()} cores, autotuning "
          f"{'on' if args.autotune else 'off'}")

    if "tfrecord" in wanted:
        path = os.path.join(args.dir, f"peer_pipeline.{os.getpid()}.tfrecord")
        try:
            record = bytearray(b"r" * 1000)
            with tf.io.TFRecordWriter(path) as writer:
                for i in range(args.records):
                    record[:8] = i.to_bytes(8, "little")
                    writer.write(bytes(record))
            # Drained in batches of 1024 records: TF runs the reduce function
            # once per batch rather than once per record (per record, the
            # function call costs tens of times the read itself).
            ds = tf.data.TFRecordDataset(path).repeat(5).batch(1024).with_options(options)

            @tf.function
            def drain(ds):
                return ds.reduce((np.int64(0), np.int64(0)), lambda acc, r: (
                    acc[0] + tf.size(r, out_type=tf.int64),
                    acc[1] + tf.reduce_sum(tf.cast(tf.strings.length(r), tf.int64))))
            drain(tf.data.TFRecordDataset(path).take(10).batch(1024))  # trace
            with open(path, "rb") as f:  # and warm it as pipeline_bench does
                while f.read(1 << 20):
                    pass
            start = time.perf_counter()
            count, nbytes = (int(x) for x in drain(ds))
            seconds = time.perf_counter() - start
            print(f"  TFRecordDataset (1000-byte records): {count / seconds:.0f} elements/s "
                  f"{nbytes / seconds / 1e6:.1f} MB/s ({count} elements, {seconds:.2f} s)")
            result("tfrecord_read_1000b", nbytes / seconds / 1e9, "GB/s")
        finally:
            if os.path.exists(path):
                os.remove(path)

    if "shuffle" in wanted:
        ds = tf.data.Dataset.range(args.elements).shuffle(10000, seed=1).batch(256).prefetch(tf.data.AUTOTUNE)
        ds = ds.with_options(options)

        @tf.function
        def drain_batches(ds):
            return ds.reduce(np.int64(0), lambda n, b: n + tf.size(b, out_type=tf.int64))
        drain_batches(tf.data.Dataset.range(1000).batch(256))  # trace
        start = time.perf_counter()
        count = int(drain_batches(ds))
        seconds = time.perf_counter() - start
        assert count == args.elements, count
        print(f"  range.shuffle(10000).batch(256).prefetch: {count / seconds:.0f} elements/s "
              f"({count} elements, {seconds:.2f} s)")
        result("shuffle10000_batch256", count / seconds, "elements/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
