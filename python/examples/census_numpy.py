"""Census income (UCI adult) with numpy, reading its input through Capstan's
data service: the data workers read, parse and featurize the CSV (the
census module's functions), shuffle and batch it; this program trains a
logistic regression over the wide (categorical, crossed, bucketized)
columns and the numeric ones, in numpy, then scores adult.test.

    build/bin/data-dispatcher --port 7500 &
    build/bin/data-worker --dispatcher 127.0.0.1:7500 --module build/lib/libcensus_module.so &
    PYTHONPATH=build/python python3 python/examples/census_numpy.py --dispatcher 127.0.0.1:7500

Without --dispatcher it starts a dispatcher and a data worker itself (from
build/bin) and stops them at the end. Prints the held-out accuracy; exits
1 below --min-accuracy.
"""

import argparse
import contextlib
import pathlib
import sys
import time

import numpy as np

import capstan
import capstan.local
from capstan.data import Fn

REPO = pathlib.Path(__file__).resolve().parents[2]


def examples(path):
    """(wide_ids int64[15], numeric float32[5], label float32) per record."""
    record_defaults = [np.int64(0) if column in (0, 2, 4, 10, 11, 12) else b"" for column in range(15)]
    return (capstan.data.TextLineDataset(str(path), "GZIP")
            .filter(Fn.named("census_is_record"))
            .map(Fn.decode_csv(record_defaults, na_value="?", trim_whitespace=True))
            .map(Fn.named("census_features")))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dispatcher", help="the data service's dispatcher (default: start one)")
    parser.add_argument("--data-dir", default=str(REPO / "examples" / "census" / "data"))
    parser.add_argument("--module", default=str(REPO / "build" / "lib" / "libcensus_module.so"))
    parser.add_argument("--bin-dir", default=str(REPO / "build" / "bin"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=0.2)
    parser.add_argument("--min-accuracy", type=float, default=0.85)
    args = parser.parse_args()

    data_dir = pathlib.Path(args.data_dir)
    with contextlib.ExitStack() as stack:
        dispatcher = args.dispatcher or stack.enter_context(
            capstan.local.DataService(args.bin_dir, modules=[args.module]))
        return train_and_evaluate(args, data_dir, dispatcher)


def train_and_evaluate(args, data_dir, dispatcher):
    """Trains on adult.data read through the service; 0 when adult.test's
    accuracy meets --min-accuracy, else 1."""
    train = examples(data_dir / "adult.data.gz").shuffle(10000, seed=1).repeat(args.epochs).batch(args.batch_size)
    dataset_id = capstan.data.service.register_dataset(dispatcher, train)
    batches = capstan.data.service.from_dataset_id(dispatcher, dataset_id, processing_mode="off",
                                                   job_name="census-numpy")
    # Logistic regression: a weight per wide id (and a bias), and per
    # numeric feature; Adagrad, as the C++ example's wide part.
    wide = np.zeros(1 << 13)
    numeric = np.zeros(5)
    bias = 0.0
    acc_wide, acc_numeric, acc_bias = np.full_like(wide, 0.1), np.full_like(numeric, 0.1), 0.1
    lr = args.learning_rate
    started = time.monotonic()
    seen = 0
    for step, (ids, x, y) in enumerate(batches):  # numpy arrays over the received buffers
        logits = wide[ids].sum(axis=1) + x @ numeric + bias
        error = 1.0 / (1.0 + np.exp(-logits)) - y  # d(log-loss)/d(logit)
        g_wide = np.bincount(ids.ravel(), weights=np.repeat(error, ids.shape[1]), minlength=wide.size)
        g_numeric = x.T @ error
        g_bias = error.sum()
        acc_wide += g_wide ** 2
        acc_numeric += g_numeric ** 2
        acc_bias += g_bias ** 2
        wide -= lr * g_wide / np.sqrt(acc_wide)
        numeric -= lr * g_numeric / np.sqrt(acc_numeric)
        bias -= lr * g_bias / np.sqrt(acc_bias)
        seen += len(y)
        if step % 200 == 0:
            loss = np.mean(np.logaddexp(0, logits) - y * logits)
            print(f"step {step:5d}  examples {seen:7d}  loss {loss:.4f}", flush=True)
    seconds = time.monotonic() - started
    print(f"census_numpy: trained on {seen} examples in {seconds:.1f} s ({seen / seconds:.0f} examples/s) "
          f"read through the data service at {dispatcher}")

    # Held-out accuracy on adult.test, read in this process.
    capstan.load_module(args.module)
    correct = total = 0
    for ids, x, y in examples(data_dir / "adult.test.gz").batch(4096):
        logits = wide[ids].sum(axis=1) + x @ numeric + bias
        correct += int(((logits > 0) == (y > 0.5)).sum())
        total += len(y)
    accuracy = correct / total
    verdict = "PASS" if accuracy >= args.min_accuracy else "FAIL"
    print(f"census_numpy: test accuracy {accuracy:.4f} over {total} examples "
          f"(target: at least {args.min_accuracy}) {verdict}")
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
