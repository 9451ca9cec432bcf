"""TensorFlow's side of data_service_bench: elements/s and GB/s that ONE
consumer reads through the tf.data service.

A tf.data.experimental.service.DispatchServer and one WorkerServer run in a
subprocess (the worker's data crosses loopback TCP, as with Capstan's
data-worker; --in-process puts them in this process, where TF may read
from the worker without RPCs). This process reads, with
tf.data.experimental.service.distribute(processing_mode="parallel_epochs")
(data_service_bench's OFF mode: the worker runs the whole pipeline) and
compression=None (Capstan's service sends elements uncompressed; TF's
default "AUTO" would compress these all-zero elements to almost nothing):

  small  from_tensors(uint8[100]).repeat(N)      100-byte elements
  large  from_tensors(uint8[1 MiB]).repeat(M)    1 MiB elements

The clock starts at the first element (job creation, task assignment and
pipeline start-up are not counted), as in data_service_bench, and the RESULT
figures stop it at the LAST element: TF's consumer learns of the end of
sequence only on a polling tick (it comes on whole seconds after the first
element, up to a second after the last one), which would make short runs
look slower than TF streams. (data_service_bench stops at end of sequence,
which arrives with its last reply; the figures to end of sequence are
printed too, and as RESULT ..._to_eos.) Elements are read by a Python loop
over the dataset: at TF's service rates that costs little next to the
service's own time.

    bench/peers/.venv/bin/python bench/peers/data_service.py [--small 20000] [--large 2000]

Prints RESULT data_service_100b_1w (elements/s) and data_service_1mib_1w (GB/s).
"""
import argparse
import os
import subprocess
import sys
import time

import peer_common
from peer_common import result


def start_servers():
    """DispatchServer and one WorkerServer in this process; returns them."""
    import tensorflow as tf
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=peer_common.free_port()))
    address = dispatcher.target.split("://")[1]
    worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=address, port=peer_common.free_port()))
    return dispatcher, worker


def serve():
    dispatcher, _worker = start_servers()
    print(dispatcher.target, flush=True)
    sys.stdin.read()  # until the consumer closes our stdin or ends
    os._exit(0)


def read(target, element_bytes, count):
    import tensorflow as tf
    ds = tf.data.Dataset.from_tensors(tf.zeros([element_bytes], tf.uint8)).repeat(count)
    ds = ds.apply(tf.data.experimental.service.distribute(
        processing_mode="parallel_epochs", service=target, compression=None))
    it = iter(ds)
    first = next(it)
    assert first.shape == (element_bytes,)
    start = time.perf_counter()
    n = 0
    last = start
    for _ in it:
        n += 1
        last = time.perf_counter()
    seconds = time.perf_counter() - start
    assert n + 1 == count, (n + 1, count)
    return n, seconds, last - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", type=int, default=20000, help="100-byte elements; 0: none")
    parser.add_argument("--large", type=int, default=2000, help="1 MiB elements; 0: none")
    parser.add_argument("--in-process", action="store_true", help="the dispatcher and worker in this process")
    args = parser.parse_args()

    server = None
    if args.in_process:
        servers = start_servers()
        target = servers[0].target
    else:
        server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        target = server.stdout.readline().strip()
        if not target:
            server.wait()
            print("data_service.py: the tf.data service did not start (its error is above)", file=sys.stderr)
            return 1
    try:
        import tensorflow as tf
        print(f"tensorflow {tf.__version__} tf.data service, 1 worker "
              f"({'in-process' if args.in_process else 'in a subprocess'}), one consumer, parallel_epochs, "
              f"no compression:")
        if args.small > 0:
            n, seconds, to_last = read(target, 100, args.small)
            print(f"  100 B elements: {n / to_last:.0f} elements/s {n * 100 / to_last / 1e6:.1f} MB/s "
                  f"({args.small} elements, the last at {to_last:.2f} s; end of sequence at {seconds:.2f} s: "
                  f"{n / seconds:.0f} elements/s)")
            result("data_service_100b_1w", n / to_last, "elements/s")
            result("data_service_100b_1w_to_eos", n / seconds, "elements/s")
        if args.large > 0:
            n, seconds, to_last = read(target, 1 << 20, args.large)
            print(f"  1 MiB elements: {n / to_last:.0f} elements/s {n * (1 << 20) / to_last / 1e6:.1f} MB/s "
                  f"({args.large} elements, the last at {to_last:.2f} s; end of sequence at {seconds:.2f} s: "
                  f"{n * (1 << 20) / seconds / 1e6:.1f} MB/s)")
            result("data_service_1mib_1w", n * (1 << 20) / to_last / 1e9, "GB/s")
            result("data_service_1mib_1w_to_eos", n * (1 << 20) / seconds / 1e9, "GB/s")
    finally:
        if server is not None:
            server.stdin.close()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    sys.exit(main())
