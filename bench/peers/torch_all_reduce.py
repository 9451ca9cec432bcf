"""PyTorch's side of collective_bench: torch.distributed.all_reduce (SUM,
float32) between 2 processes on this host on the gloo backend (TCP on
loopback), timed like collective_bench: rank 0 takes the median of several
calls per size, each between barriers; algbw = bytes / time, busbw = algbw
* 2(n-1)/n. Prints a table and a RESULT line per size for bench/compare:

    RESULT allreduce_4b_2r <p50> us
    RESULT allreduce_1mib_2r <busbw> GB/s   (and 16mib, 64mib)

Run it with Debian's python3-torch (/usr/bin/python3) from a directory other
than the repository root (the repository's torch/ folder would shadow the
package there); bench/compare does. Written from PyTorch's public API;
nothing here is a dependency of Capstan.
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer_common import free_port


def iterations_for(size):
    # collective_bench's counts, so both sides average alike.
    if size <= 64 << 10:
        return 300
    if size <= 4 << 20:
        return 40
    if size <= 64 << 20:
        return 8
    return 4


def size_name(size):
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20}mib"
    if size >= 1024 and size % 1024 == 0:
        return f"{size >> 10}kib"
    return f"{size}b"


def rank_main(rank, ranks, port, sizes):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32)
        seconds = []
        for i in range(iterations_for(size) + 2):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            if i >= 2:
                seconds.append(time.perf_counter() - start)
        if rank == 0:
            p50 = statistics.median(seconds)
            algbw = size / p50 / 1e9
            busbw = algbw * 2 * (ranks - 1) / ranks
            print(f"all_reduce torch {ranks:5d} {size:12d} {p50 * 1e6:12.1f} {algbw:10.3f} {busbw:10.3f}")
            name = f"allreduce_{size_name(size)}_{ranks}r"
            if size < 1024:
                print(f"RESULT {name} {p50 * 1e6:.1f} us", flush=True)
            else:
                print(f"RESULT {name} {busbw:.3f} GB/s", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,1048576,16777216,67108864", help="bytes, comma-separated")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if any(s < 4 or s % 4 for s in sizes):
        parser.error(f"--sizes takes multiples of 4 bytes, not {args.sizes}")
    print(f"# torch {torch.__version__} torch.distributed gloo over TCP on loopback; {args.ranks} ranks; "
          "times are medians")
    print(f"{'op':<10} {'via':<5} {'ranks':>5} {'bytes':>12} {'p50_us':>12} {'algbw_GB/s':>10} {'busbw_GB/s':>10}",
          flush=True)
    mp.spawn(rank_main, args=(args.ranks, free_port(), sizes), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
