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
import subprocess
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

import capstan
import capstan.torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "peers"))
from ddp import make_model  # noqa: E402  (the peer's model, the same layers)


def start(bin_dir, directory, program, *args):
    port_file = pathlib.Path(directory) / f"{program}.port"
    process = subprocess.Popen([str(pathlib.Path(bin_dir) / program), "--host", "127.0.0.1", "--port", "0",
                                "--http-port", "0", "--port-file", str(port_file), *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while not port_file.exists() or "pid:" not in port_file.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"{program} did not start")
        time.sleep(0.02)
    fields = dict(line.split(": ", 1) for line in port_file.read_text().splitlines() if ": " in line)
    return process, f"127.0.0.1:{fields['rpc_port']}"


def worker(rank, args, coordinator):
    torch.set_num_threads(args.threads)
    cluster = capstan.ClusterCoordinator.connect(coordinator)
    group = cluster.join_group("python-ddp", size=args.ranks, rank=rank, timeout=60)
    torch.manual_seed(rank)  # construction broadcasts rank 0's initial values
    model = capstan.torch.DistributedDataParallel(make_model(args.layers, args.width), group,
                                                  bucket_cap_mb=args.bucket_mb)
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
    group.barrier()
    start_time = time.perf_counter()
    for _ in range(args.steps):
        step()
    group.barrier()
    seconds = time.perf_counter() - start_time
    if rank == 0:
        print(f"python_ddp.py: {args.ranks} ranks, {args.layers} x Linear({args.width}, {args.width}), batch "
              f"{args.batch} per rank, {args.threads} thread(s) each, capstan.torch.DistributedDataParallel "
              f"({len(model.buckets)} bucket(s)), torch {torch.__version__}", flush=True)
        print(f"RESULT ddp_mlp {args.steps / seconds:.6g} steps/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--bin-dir", default=os.environ.get("CAPSTAN_BIN_DIR",
                                                            pathlib.Path(__file__).resolve().parents[1] / "build" / "bin"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        daemons = []
        try:
            ps, ps_address = start(args.bin_dir, directory, "ps-server", "--task-index", "0")
            daemons.append(ps)
            coordinator, address = start(args.bin_dir, directory, "coordinator", "--ps", ps_address)
            daemons.append(coordinator)
            mp.spawn(worker, args=(args, address), nprocs=args.ranks, join=True)
        finally:
            for d in daemons:
                d.kill()
                d.wait()


if __name__ == "__main__":
    main()
