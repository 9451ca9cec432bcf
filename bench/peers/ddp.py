"""PyTorch's side of ddp_bench: the same dense MLP (--layers Linear(width,
width), ReLU between them, mean squared error against a fixed target,
float32, SGD) trained with torch.nn.parallel.DistributedDataParallel on the
gloo backend, 2 processes on this host, --batch examples each, --threads
intra-op threads each. Rank 0 times --steps steps between barriers (after
--warmup untimed ones) and prints

    RESULT ddp_mlp <steps/s> steps/s

Run it with Debian's python3-torch (/usr/bin/python3) from a directory other
than the repository root (the repository's torch/ and python/ folders would
shadow the torch package there); bench/ddp_bench.sh does. Written from
PyTorch's public API; nothing here is a dependency of Capstan.
"""
import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(layers, width):
    modules = []
    for i in range(layers):
        if i > 0:
            modules.append(torch.nn.ReLU())
        modules.append(torch.nn.Linear(width, width))
    return torch.nn.Sequential(*modules)


def timed_steps(model, rank, args, barrier):
    """--warmup untimed steps, then --steps timed between barriers; the
    seconds they took."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)
    x = torch.randn(args.batch, args.width)
    y = torch.randn(args.batch, args.width)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    barrier()
    return time.perf_counter() - start


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(rank)  # DDP broadcasts rank 0's initial values
    model = DistributedDataParallel(make_model(args.layers, args.width))
    seconds = timed_steps(model, rank, args, dist.barrier)
    if rank == 0:
        print(f"ddp.py: {args.ranks} ranks, {args.layers} x Linear({args.width}, {args.width}), batch {args.batch} "
              f"per rank, {args.threads} thread(s) each, gloo, torch {torch.__version__}", flush=True)
        print(f"RESULT ddp_mlp {args.steps / seconds:.6g} steps/s", flush=True)
    dist.destroy_process_group()


def add_arguments(parser):
    """The workload's flags (bench/python_ddp.py takes the same)."""
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args()
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
