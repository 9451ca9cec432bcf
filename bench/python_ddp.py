"""Capstan's DDP from Python (capstan.torch.DistributedDataParallel) on the
model of bench/peers/ddp.py: the same dense MLP, batch, SGD and timing, 2
processes on this host, the gradients all-reduced over Capstan's
collectives (shared memory between the two processes) instead of gloo.
Starts a ps-server and a coordinator of the build (--bin-dir, default
build/bin; the group forms through the coordinator) and stops them at the
end. Rank 0 prints

    RESULT ddp_mlp <steps/s> steps/s

Run it with the interpreter the bindings were built for (/usr/bin/python3)
from a directory other than the repository root, with PYTHONPATH naming
the build's python/ directory; bench/ddp_bench.sh does.
"""
import argparse
import os
import pathlib
import sys

import torch
import torch.multiprocessing as mp

import capstan
import capstan.local
import capstan.torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "peers"))
from ddp import add_arguments, make_model, timed_steps  # noqa: E402  (the peer's workload, the same steps)


def worker(rank, args, coordinator):
    torch.set_num_threads(args.threads)
    cluster = capstan.ClusterCoordinator.connect(coordinator)
    group = cluster.join_group("python-ddp", size=args.ranks, rank=rank, timeout=60)
    torch.manual_seed(rank)  # construction broadcasts rank 0's initial values
    model = capstan.torch.DistributedDataParallel(make_model(args.layers, args.width), group,
                                                  bucket_cap_mb=args.bucket_mb)
    seconds = timed_steps(model, rank, args, group.barrier)
    if rank == 0:
        print(f"python_ddp.py: {args.ranks} ranks, {args.layers} x Linear({args.width}, {args.width}), batch "
              f"{args.batch} per rank, {args.threads} thread(s) each, capstan.torch.DistributedDataParallel "
              f"({len(model.buckets)} bucket(s)), torch {torch.__version__}", flush=True)
        print(f"RESULT ddp_mlp {args.steps / seconds:.6g} steps/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--bin-dir", default=os.environ.get("CAPSTAN_BIN_DIR",
                                                            pathlib.Path(__file__).resolve().parents[1] / "build" / "bin"))
    args = parser.parse_args()
    with capstan.local.ParameterServers(args.bin_dir) as coordinator:
        mp.spawn(worker, args=(args, coordinator), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
