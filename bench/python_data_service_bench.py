"""Data-service elements into Python (numpy arrays, no copy) against the C++
reader alone, on the same job shape, alternating, medians of --rounds.

    PYTHONPATH=build/python python3 bench/python_data_service_bench.py [--rounds 5] [--elements 400]

Starts a dispatcher and a data worker (build/bin, capstan.local.DataService). Each round
registers `from_tensors(element).repeat(N)` and reads it once through
capstan.data.service.from_dataset_id, iterating in Python (each element a
numpy array over the received buffer), and once more in C++ only
(capstan._capstan._drain: the SDK's reader with no Python objects). Prints
GB/s and elements/s of both, the ratio (the issue's aim: >= 0.8 for 1 MiB
elements) and RESULT lines. Prints figures; never fails on them.
"""

import argparse
import pathlib
import statistics
import time

import numpy as np

import capstan
import capstan.local
from capstan import _capstan

REPO = pathlib.Path(__file__).resolve().parents[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", default=str(REPO / "build" / "bin"))
    parser.add_argument("--element-bytes", type=int, default=1 << 20)
    parser.add_argument("--elements", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with capstan.local.DataService(args.bin_dir) as dispatcher:
        element = np.arange(args.element_bytes, dtype=np.uint8)
        dataset_id = capstan.data.service.register_dataset(
            dispatcher, capstan.data.Dataset.from_tensors((element,)).repeat(args.elements))
        total = args.elements * args.element_bytes
        python_rates, cpp_rates = [], []
        for round_ in range(args.rounds):
            # A new anonymous job per read: each reads every element once.
            # The two readers take turns going first.

            def read_python():
                started = time.perf_counter()
                n = 0
                for (x,) in capstan.data.service.from_dataset_id(dispatcher, dataset_id):
                    n += 1
                    last = int(x[-1])  # touch the array, as a consumer would
                assert n == args.elements and last == element[-1]
                return time.perf_counter() - started

            def read_cpp():
                started = time.perf_counter()
                count, nbytes = _capstan._drain(capstan.data.service.from_dataset_id(dispatcher, dataset_id))
                assert count == args.elements and nbytes == total
                return time.perf_counter() - started

            if round_ % 2 == 0:
                python_s, cpp_s = read_python(), read_cpp()
            else:
                cpp_s, python_s = read_cpp(), read_python()
            python_rates.append(total / python_s)
            cpp_rates.append(total / cpp_s)
            print(f"round {round_ + 1}: python {total / python_s / 1e9:.2f} GB/s, C++ reader {total / cpp_s / 1e9:.2f} GB/s, "
                  f"ratio {cpp_s / python_s:.2f}", flush=True)
        ratios = [p / c for p, c in zip(python_rates, cpp_rates)]
        py_med, cpp_med, ratio = statistics.median(python_rates), statistics.median(cpp_rates), statistics.median(ratios)
        size = f"{args.element_bytes / (1 << 20):g} MiB" if args.element_bytes >= 1 << 20 else f"{args.element_bytes} B"
        print(f"\n{args.elements} elements of {size} through the data service, medians of {args.rounds} rounds:")
        print(f"  into Python (numpy, no copy)  {py_med / 1e9:6.2f} GB/s  {py_med / args.element_bytes:9.0f} elements/s")
        print(f"  C++ reader alone              {cpp_med / 1e9:6.2f} GB/s  {cpp_med / args.element_bytes:9.0f} elements/s")
        print(f"  Python / C++                  {ratio:6.2f}   (aim >= 0.80)")
        print(f"RESULT python_ds_read_gbps {py_med / 1e9:.6g} GB/s")
        print(f"RESULT cpp_ds_read_gbps {cpp_med / 1e9:.6g} GB/s")
        print(f"RESULT python_vs_cpp_ds_read_ratio {ratio:.6g} x")


if __name__ == "__main__":
    main()
