"""PyTorch on Capstan: a torch.utils.data.IterableDataset over a Capstan
pipeline or the data service, so that a PyTorch loop reads from Capstan:

    import capstan.torch
    loader = torch.utils.data.DataLoader(
        capstan.torch.IterableDataset(capstan.data.service.from_dataset_id(dispatcher, dataset_id,
                                                                           job_name="train")),
        batch_size=None)   # the pipeline batches
    for features, labels in loader: ...

Each element comes as a tuple of torch tensors made with torch.from_dlpack,
sharing Capstan's buffers (no copy). Capstan's arrays are read-only (they
share the received buffers): treat the tensors as read-only too. String
components stay numpy arrays of bytes (torch has no strings).

And data-parallel training over Capstan's collectives:

    group = cluster.join_group("ddp", size=2, rank=rank)        # every process
    model = capstan.torch.DistributedDataParallel(net, group)  # rank 0's values everywhere
    loss_fn(model(x), y).backward()                            # gradients averaged over the group
    optimizer.step()

Importing this module needs torch; the rest of capstan does not.
"""

import concurrent.futures as _futures
import contextlib as _contextlib
import threading as _threading

import torch as _torch
import torch.utils.data as _torch_data

from ._array import Array as _Array


def as_tensor(array):
    """A torch tensor over a Capstan array's buffer (DLPack, no copy); any
    other array through torch.as_tensor. Arrays of bytes stay as they are."""
    if isinstance(array, _Array):
        return _torch.from_dlpack(array)
    if getattr(array, "dtype", None) is not None and array.dtype.kind in "OSU":
        return array
    return _torch.as_tensor(array)


def _reads_data_service(dataset):
    return "data_service" in repr(dataset)


class IterableDataset(_torch_data.IterableDataset):
    """Iterates `dataset` (a capstan.data.Dataset), each element a tuple of
    torch tensors.

    With DataLoader worker processes (num_workers > 0), each worker
    iterates its own shard, dataset.shard(num_workers, worker_id), so that
    every element comes once; `shard=False` turns that off. A pipeline that
    reads the data service is not sharded by default: readers of a job
    shared by name (job_name=...) already get each element once between
    them (without a job name every reader gets its own job, the whole
    dataset)."""

    def __init__(self, dataset, shard=None):
        super().__init__()
        self._dataset = dataset
        self._shard = (not _reads_data_service(dataset)) if shard is None else bool(shard)

    def __iter__(self):
        dataset = self._dataset
        info = _torch_data.get_worker_info()
        if self._shard and info is not None and info.num_workers > 1:
            dataset = dataset.shard(info.num_workers, info.id)
        for element in dataset:
            yield tuple(as_tensor(a) for a in element)


class DistributedDataParallel(_torch.nn.Module):
    """torch.nn.parallel.DistributedDataParallel over a Capstan group (a
    capstan.Communicator from ClusterCoordinator.join_group): shared memory
    between processes of one host, TCP across hosts.

    At construction every parameter and buffer takes rank 0's value
    (broadcast). During backward, gradients are averaged over the group in
    buckets of about `bucket_cap_mb` MiB, in the reverse order of the
    module's parameters (the order backward produces them, as torch's DDP):
    a bucket is all-reduced on a thread of its own as soon as its last
    gradient is ready, while backward goes on; backward returns when every
    bucket is back in .grad. A parameter that got no gradient in this
    backward counts as a zero gradient (every rank all-reduces every bucket,
    in the same order). A dead or stopped rank fails the collective after
    the group's timeout, naming it, and backward raises that error
    (capstan.UnavailableError, ...): form a new group to go on.

    no_sync(): a context in which backward accumulates local gradients only
    (gradient accumulation); the next backward outside it averages them."""

    def __init__(self, module, group, bucket_cap_mb=25.0, broadcast_parameters=True):
        super().__init__()
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be more than 0, not {bucket_cap_mb}")
        self.module = module
        self.group = group
        self._sync = True
        if broadcast_parameters:
            self._broadcast_state()
        seen = set()
        params = []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            raise ValueError("the module has no parameter that requires grad")
        for p in params:
            if p.device.type != "cpu":
                raise ValueError(f"parameter on {p.device}: capstan.torch.DistributedDataParallel takes CPU "
                                 "tensors (CUDA tensors over NCCL are not routed from Python yet)")
        # Buckets in the order backward fills them: the reverse of the
        # parameters' (torch's DDP does the same).
        cap = int(bucket_cap_mb * (1 << 20))
        self._buckets = []
        bucket, size = [], 0
        for p in reversed(params):
            if bucket and (size + p.numel() * p.element_size() > cap or p.dtype != bucket[0].dtype):
                self._buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(p)
            size += p.numel() * p.element_size()
        self._buckets.append(bucket)
        self._bucket_of = {}
        for i, b in enumerate(self._buckets):
            for p in b:
                self._bucket_of[id(p)] = i
        # One thread: buckets go out in order, the same on every rank.
        self._executor = _futures.ThreadPoolExecutor(1, thread_name_prefix="capstan-ddp")
        self._lock = _threading.Lock()
        self._reset()
        # The hook of each parameter's gradient accumulator runs once the
        # gradient is in .grad (torch 1.13 has no post-accumulate hook on
        # the tensor itself).
        self._accumulators = []
        for p in params:
            accumulator = p.view_as(p).grad_fn.next_functions[0][0]
            accumulator.register_hook(self._make_hook(p))
            self._accumulators.append(accumulator)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @_contextlib.contextmanager
    def no_sync(self):
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before

    @property
    def buckets(self):
        """The buckets, each a list of parameters, in all-reduce order."""
        return [list(b) for b in self._buckets]

    def _broadcast_state(self):
        with _torch.no_grad():
            for t in list(self.module.parameters()) + list(self.module.buffers()):
                if t.numel() == 0:
                    continue
                value = self.group.broadcast(t.detach(), root=0)
                t.copy_(as_tensor(value).view_as(t))

    def _reset(self):
        self._pending = [len(b) for b in self._buckets]
        self._ready = set()
        self._next = 0
        self._futures = []
        self._active = False

    def _make_hook(self, p):
        def hook(*unused):
            if self._sync:
                self._on_ready(p)
        return hook

    def _on_ready(self, p):
        with self._lock:
            if not self._active:
                self._active = True
                _torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            if id(p) in self._ready:
                return  # a parameter used twice: its accumulator runs once per backward anyway
            self._ready.add(id(p))
            self._pending[self._bucket_of[id(p)]] -= 1
            while self._next < len(self._buckets) and self._pending[self._next] == 0:
                self._launch(self._next)

    def _launch(self, index):
        grads = []
        for p in self._buckets[index]:
            g = p.grad
            grads.append(g.reshape(-1) if g is not None else _torch.zeros(p.numel(), dtype=p.dtype))
        flat = _torch.cat(grads) if len(grads) > 1 else grads[0].clone()
        group = self.group
        self._futures.append(self._executor.submit(lambda: group.all_reduce(flat, "mean")))
        self._next += 1

    def _finish(self):
        with self._lock:
            while self._next < len(self._buckets):
                self._launch(self._next)  # parameters without a gradient: zeros
            futures, self._futures = self._futures, []
            self._reset()
        with _torch.no_grad():
            for bucket, future in zip(self._buckets, futures):
                averaged = as_tensor(future.result())  # raises the collective's error
                offset = 0
                for p in bucket:
                    n = p.numel()
                    # A view of the all-reduce's own result (no copy; nothing
                    # else holds that buffer), as torch's gradient_as_bucket_view.
                    p.grad = averaged[offset:offset + n].view_as(p)
                    offset += n
