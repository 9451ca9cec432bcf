#!/usr/bin/env python3
"""capstan.torch on CUDA tensors, for a GPU machine with a CUDA PyTorch:
all_reduce_ and broadcast_ take CUDA tensors through NCCL on their device
(in place, queued on torch's current stream), and DistributedDataParallel
averages a CUDA module's gradients there. A group of one rank (one
process, one GPU; NCCL refuses two ranks on one GPU): every result checked
against local torch, then the time of a DDP step beside torch's own DDP
(NCCL backend) on the same model.

    PYTHONPATH=build/python python3 bench/python_cuda_check.py BIN_DIR

BIN_DIR holds the coordinator and ps-server (the group forms through the
coordinator). Exits 1 naming each failed check; 2 where there is no GPU.
"""
import statistics
import sys
import tempfile
import time

import torch

import capstan
import capstan.local
import capstan.torch

failures = []
passed = 0


def expect(ok, what):
    global passed
    if ok:
        passed += 1
    else:
        failures.append(what)
        print(f"FAILED: {what}", flush=True)


def mlp(seed, width, device):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 1)).to(device)


def collectives(group, device):
    pattern = torch.arange(1 << 20, device=device) % 7
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64):
        x = (pattern + 1).to(dtype)
        before = x.data_ptr()
        capstan.torch.all_reduce_(x, group, "sum")
        expect(x.data_ptr() == before and torch.equal(x, (pattern + 1).to(dtype)), f"all_reduce_ sum {dtype}")
        if dtype.is_floating_point:
            m = (pattern + 1).to(dtype)
            capstan.torch.all_reduce_(m, group, "mean")
            expect(torch.equal(m, (pattern + 1).to(dtype)), f"all_reduce_ mean {dtype}")
        b = (pattern + 2).to(dtype)
        capstan.torch.broadcast_(b, group, root=0)
        expect(torch.equal(b, (pattern + 2).to(dtype)), f"broadcast_ {dtype}")
    # Ordering on a side stream: the product is still being computed there
    # when the all-reduce is queued; NCCL must take its result.
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        torch.manual_seed(0)
        a = torch.randn(4096, 4096, device=device)
        product = a @ a
        copy = product.clone()
        capstan.torch.all_reduce_(product, group, "max")
        same = torch.equal(product, copy)
    expect(same, "all_reduce_ on a side stream reduces the product queued before it")
    # Dtypes NCCL lacks go through the host.
    flags = torch.arange(10, device=device) % 2 == 0
    capstan.torch.broadcast_(flags, group, root=0)
    expect(flags.is_cuda and torch.equal(flags.cpu(), torch.arange(10) % 2 == 0), "broadcast_ of a CUDA bool tensor")
    shorts = (pattern[:100] + 1).to(torch.int16)
    capstan.torch.broadcast_(shorts, group, root=0)
    expect(shorts.is_cuda and torch.equal(shorts, (pattern[:100] + 1).to(torch.int16)), "broadcast_ of CUDA int16")
    try:
        capstan.torch.all_reduce_((pattern[:100] + 1).to(torch.int8), group, "sum")
        expect(False, "a CUDA int8 all-reduce is refused as a CPU one is")
    except capstan.InvalidArgumentError as e:
        expect("cannot reduce int8" in str(e), f"a CUDA int8 all-reduce is refused as a CPU one is: {e}")
    # NCCL's in-place write is an in-place change to autograd.
    w = torch.ones(4, device=device, requires_grad=True)
    saved = w * 2
    loss = (saved * saved).sum()
    with torch.no_grad():
        capstan.torch.all_reduce_(saved, group, "sum")
    try:
        loss.backward()
        expect(False, "backward through a tensor NCCL changed in place is refused")
    except RuntimeError as e:
        expect("inplace" in str(e), f"backward through a tensor NCCL changed in place is refused: {e}")
    try:
        capstan.torch.all_reduce_(torch.ones(8, 8, device=device).t(), group)
        expect(False, "a non-contiguous CUDA tensor is refused")
    except ValueError as e:
        expect("not contiguous" in str(e), f"a non-contiguous CUDA tensor is refused: {e}")


def ddp_matches_local(group, device):
    """5 SGD steps of DDP (several buckets) against plain local training."""
    torch.manual_seed(1)
    xs = [torch.randn(32, 64, device=device) for _ in range(5)]
    ys = [torch.randn(32, 1, device=device) for _ in range(5)]
    local, wrapped = mlp(3, 256, device), mlp(3, 256, device)
    model = capstan.torch.DistributedDataParallel(wrapped, group, bucket_cap_mb=0.1)
    expect(len(model.buckets) > 2, f"DDP on CUDA packs several buckets (got {len(model.buckets)})")
    opt_local = torch.optim.SGD(local.parameters(), lr=0.05)
    opt_ddp = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in zip(xs, ys):
        for net, opt in ((local, opt_local), (model, opt_ddp)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    grads_on_device = all(p.grad is not None and p.grad.is_cuda for p in model.parameters())
    expect(grads_on_device, "DDP's averaged gradients stay on the GPU")
    worst = max((a - b).abs().max().item() for a, b in zip(local.parameters(), wrapped.parameters()))
    expect(worst == 0.0, f"DDP on CUDA with one rank trains exactly as local torch (max difference {worst})")
    try:
        mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).to(device))
        capstan.torch.DistributedDataParallel(mixed, group, broadcast_parameters=False)
        expect(False, "a module on two devices is refused")
    except ValueError as e:
        expect("all on the CPU or all on one CUDA device" in str(e), f"a module on two devices is refused: {e}")


def step_times(model, steps, device):
    torch.manual_seed(2)
    x, y = torch.randn(256, 64, device=device), torch.randn(256, 1, device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for i in range(steps + 5):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize(device)
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def ddp_beside_torch(group, device):
    """Median step of an MLP (4 x 2048 wide, ~12.6 M parameters) under
    Capstan's DDP and torch's (NCCL backend, one rank), alternating."""
    store = tempfile.NamedTemporaryFile(delete=False)
    torch.distributed.init_process_group("nccl", init_method=f"file://{store.name}", rank=0, world_size=1,
                                         device_id=device)
    ours = capstan.torch.DistributedDataParallel(mlp(4, 2048, device), group)
    theirs = torch.nn.parallel.DistributedDataParallel(mlp(4, 2048, device), device_ids=[device.index])
    capstan_ms, torch_ms = [], []
    for _ in range(5):
        capstan_ms.append(step_times(ours, 40, device))
        torch_ms.append(step_times(theirs, 40, device))
    torch.distributed.destroy_process_group()
    c, t = statistics.median(capstan_ms), statistics.median(torch_ms)
    print(f"python_cuda_check: DDP step of a 12.6 M-parameter MLP on one GPU (median of 5 x 40 steps, alternating): "
          f"capstan {c:.3f} ms, torch DDP (nccl) {t:.3f} ms, torch/capstan {t / c:.2f}x", flush=True)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("python_cuda_check: this torch sees no GPU", file=sys.stderr)
        return 2
    why = capstan.Communicator.device_collectives()
    if why is not None:
        print(f"python_cuda_check: Capstan's device collectives cannot run here: {why}", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    print(f"python_cuda_check: torch {torch.__version__} on {torch.cuda.get_device_name(device)}", flush=True)
    with capstan.local.ParameterServers(sys.argv[1], ps=1) as coordinator:
        cluster = capstan.ClusterCoordinator.connect(coordinator)
        group = cluster.join_group("cuda-check", size=1, rank=0, timeout=60)
        collectives(group, device)
        ddp_matches_local(group, device)
        ddp_beside_torch(group, device)
    print(f"python_cuda_check: {passed} checks passed, {len(failures)} failed", flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
