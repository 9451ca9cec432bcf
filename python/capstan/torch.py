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

CPU tensors take the group's host collectives (shared memory on one host,
TCP across hosts); CUDA tensors take NCCL on their own device
(capstan.torch.all_reduce_ and broadcast_ do the same for any tensor).

And parameter-server training from Python, one training process per worker
(multi-client, as TF1's between-graph replication):

    ps = capstan.torch.PsModule(net, cluster, optimizer=capstan.Optimizer.adagrad(0.05))
    for features, labels in loader:
        loss = ps.step(lambda: loss_fn(net(features), labels))   # pull, forward, backward, push

Importing this module needs torch; the rest of capstan does not.
"""

import concurrent.futures as _futures
import contextlib as _contextlib
import threading as _threading

import torch as _torch
import torch.nn.functional as _functional
import torch.utils.data as _torch_data

from . import _capstan

from ._array import Array as _Array


def as_tensor(array):
    """A torch tensor over a Capstan array's buffer (DLPack, no copy); any
    other array through torch.as_tensor. Arrays of bytes stay as they are."""
    if isinstance(array, _torch.Tensor):
        return array
    if isinstance(array, _Array):
        return _torch.from_dlpack(array)
    if getattr(array, "dtype", None) is not None and array.dtype.kind in "OSU":
        return array
    return _torch.as_tensor(array)


_DTYPE_NAMES = {
    _torch.float16: "float16", _torch.bfloat16: "bfloat16", _torch.float32: "float32", _torch.float64: "float64",
    _torch.int8: "int8", _torch.int16: "int16", _torch.int32: "int32", _torch.int64: "int64",
    _torch.uint8: "uint8", _torch.bool: "bool",
}


# The dtypes the device collectives (NCCL) take; a CUDA tensor of another
# goes through the host.
_NCCL_DTYPES = {t for t, name in _DTYPE_NAMES.items() if _capstan.Communicator._device_takes(name)}

# Where this torch can say that a tensor changed in place (newer than 1.13).
_INCREMENT_VERSION = getattr(getattr(_torch.autograd, "graph", None), "increment_version", None)


def _written_in_place(tensor):
    """NCCL wrote `tensor` through its address: autograd counts it as an
    in-place change (as copy_), where this torch can say so."""
    if _INCREMENT_VERSION is not None:
        _INCREMENT_VERSION(tensor)


def _require_device_collectives(call, device):
    why = _capstan.Communicator.device_collectives()
    if why is not None:
        raise RuntimeError(f"{call}: the tensors are on {device}, and this process cannot run CUDA collectives: "
                           f"{why}")


def _device_args(tensor, call):
    """(address, count, dtype name, device, stream) of a CUDA tensor for the
    group's device collectives, queued on torch's current stream."""
    if not tensor.is_contiguous():
        raise ValueError(f"{call}: the tensor (shape {tuple(tensor.shape)}, strides {tensor.stride()}) is not "
                         "contiguous: call .contiguous() first")
    if tensor.dtype not in _DTYPE_NAMES:
        raise ValueError(f"{call}: torch dtype {tensor.dtype} has no Capstan counterpart")
    stream = _torch.cuda.current_stream(tensor.device).cuda_stream
    return tensor.data_ptr(), tensor.numel(), _DTYPE_NAMES[tensor.dtype], tensor.device.index, stream


def _check_device(tensor, call):
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{call}: the tensor is on {tensor.device}; collectives take CPU tensors (host path) "
                         "or CUDA tensors (NCCL)")


def _in_place(tensor, group, call, on_device, on_host):
    """A collective in place on `tensor`: on_device(address, count, dtype,
    device, stream) for a CUDA tensor NCCL takes, on_host(detached tensor)
    for a CPU one; a CUDA tensor of a dtype NCCL lacks through the host."""
    _check_device(tensor, call)
    with _torch.no_grad():
        if tensor.is_cuda and tensor.dtype not in _NCCL_DTYPES and tensor.dtype in _DTYPE_NAMES:
            tensor.copy_(_in_place(tensor.cpu(), group, call, on_device, on_host))
        elif tensor.is_cuda:
            _require_device_collectives(call, tensor.device)
            on_device(*_device_args(tensor, call))
            _written_in_place(tensor)
        else:
            on_host(tensor.detach())
    return tensor


def all_reduce_(tensor, group, op="sum"):
    """In place: `tensor` becomes the reduction ("sum", "mean", "min",
    "max", "prod") of every rank's `tensor` in `group` (a
    capstan.Communicator). A CUDA tensor goes through NCCL on its device,
    queued on torch's current stream; a CPU tensor through the group's host
    collectives (read in place, the result copied back); a CUDA tensor of a
    dtype NCCL lacks (bool, int8, uint8, int16) by a copy through the host.
    Returns `tensor`."""
    def on_host(t):
        # numpy, which carries the host path, has no bfloat16: such a
        # tensor is reduced in float32 and rounded back.
        work = t.float() if t.dtype == _torch.bfloat16 else t
        t.copy_(as_tensor(group.all_reduce(work, op)).view_as(t))

    return _in_place(tensor, group, "all_reduce_",
                     lambda address, count, dtype, device, stream:
                     group._all_reduce_device(address, count, dtype, op, device, stream), on_host)


def broadcast_(tensor, group, root=0):
    """In place: `tensor` becomes rank `root`'s on every rank (NCCL for a
    CUDA tensor, as all_reduce_). Returns `tensor`."""
    def on_host(t):
        # bfloat16 travels as its bits (numpy has no bfloat16).
        bits = t.view(_torch.int16) if t.dtype == _torch.bfloat16 else t
        value = group.broadcast(bits, root=root)
        if group.rank != root:
            bits.copy_(as_tensor(value).view_as(bits))

    return _in_place(tensor, group, "broadcast_",
                     lambda address, count, dtype, device, stream:
                     group._broadcast_device(address, count, dtype, root, device, stream), on_host)


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
    between processes of one host, TCP across hosts; a module on a CUDA
    device (every parameter on that one device) has its gradients averaged
    by NCCL on it, on autograd's current stream.

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
        seen = set()
        params = []
        for p in module.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            raise ValueError("the module has no parameter that requires grad")
        devices = {p.device for p in params}
        if len(devices) != 1 or next(iter(devices)).type not in ("cpu", "cuda"):
            raise ValueError(f"parameters on {sorted(str(d) for d in devices)}: capstan.torch."
                             "DistributedDataParallel takes a module whose parameters are all on the CPU or all "
                             "on one CUDA device (call module.to(device) first)")
        self._device = next(iter(devices))
        if self._device.type == "cuda":
            _require_device_collectives("DistributedDataParallel", self._device)
        if broadcast_parameters:
            self._broadcast_state()
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
        # CPU: each bucket's own buffer, kept between steps (the host
        # all-reduce reads it and returns a new result). CUDA: a new buffer
        # each step, reduced in place by NCCL, which the gradients then view.
        self._flat = [_torch.empty(sum(p.numel() for p in b), dtype=b[0].dtype) if self._device.type == "cpu"
                      else None for b in self._buckets]
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
                if t.is_contiguous():
                    broadcast_(t, self.group, root=0)
                else:
                    t.copy_(broadcast_(t.contiguous(), self.group, root=0))

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
            grads.append(g.reshape(-1) if g is not None else _torch.zeros(p.numel(), dtype=p.dtype, device=p.device))
        group = self.group
        if self._device.type == "cuda":
            # Queued on this (autograd's) thread's current stream after the
            # copy; the executor's call returns once NCCL finished there.
            flat = _torch.cat(grads)
            args = _device_args(flat, "DistributedDataParallel")

            def reduce():
                group._all_reduce_device(*args[:3], "mean", *args[3:])
                return flat
            self._futures.append(self._executor.submit(reduce))
        else:
            # Into the bucket's own buffer, kept between steps (the
            # all-reduce reads it in place; the step's wait for every
            # bucket comes first).
            flat = self._flat[index]
            _torch.cat(grads, out=flat)
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


class PsModule:
    """Keeps a torch.nn.Module's parameters on Capstan's parameter servers,
    for a training process of its own (one per worker; they share the
    variables through the coordinator `cluster`, a ClusterCoordinator).

    Each parameter is a variable named prefix + its name ("0.weight"),
    created by the first process with the module's current values (the
    others find it and carry on from the parameter servers' values, as does
    a restarted process); a parameter of `partition_min_bytes` or more with
    two or more rows is split by rows into at most `max_shards` shards,
    unless `partitioners` names its capstan.Partitioner (by parameter name,
    without the prefix). `optimizer` (a capstan.Optimizer, applied on the
    parameter servers) for every parameter not named in `optimizers`.

    An nn.Embedding(sparse=True) keeps its table on the parameter servers
    only: its forward gathers the batch's rows (cluster.gather) and push()
    sends their gradient as sparse rows (apply_sparse_gradients), so a step
    moves a batch's rows, never the table. A capstan.torch.Embedding (a
    dynamic table, ids of any int64 value) does the same over an embedding
    table.

    step(loss_fn): pull() the dense parameters into the module, zero the
    gradients, loss = loss_fn(), backward, push() every gradient to the
    parameter servers (their optimizers apply them); returns the loss as a
    float. pull and push send their RPCs at once, from a pool of threads. Checkpoints are the coordinator's (cluster.save_checkpoint)."""

    def __init__(self, module, cluster, *, prefix="", optimizer=None, optimizers=None, partitioners=None,
                 partition_min_bytes=1 << 20, max_shards=8, create=True):
        self.module = module
        self.cluster = cluster
        self.prefix = prefix
        self._rpcs = _futures.ThreadPoolExecutor(8, thread_name_prefix="capstan-ps")
        optimizer = optimizer if optimizer is not None else _capstan.Optimizer.sgd(0.01)
        optimizers = dict(optimizers or {})
        sparse = {}
        for path, sub in module.named_modules():
            if isinstance(sub, _torch.nn.Embedding) and sub.sparse:
                if sub.max_norm is not None:
                    raise ValueError(f"embedding '{path}': max_norm renormalizes the table in place, which lives "
                                     "on the parameter servers; use max_norm=None")
                sparse[id(sub.weight)] = (path, sub)
        self._dense = []     # (variable name, parameter)
        self._sparse = []    # (variable name, nn.Embedding)
        self._gathered = {}  # variable name -> [(ids, rows leaf)] of this step
        for name, p in module.named_parameters():
            variable = prefix + name
            if id(p) in sparse:
                self._sparse.append((variable, sparse[id(p)][1]))
            else:
                self._dense.append((variable, p))
            if create:
                self._create(variable, p, optimizers.get(name, optimizer), (partitioners or {}).get(name),
                             partition_min_bytes, max_shards)
        for variable, embedding in self._sparse:
            embedding.forward = self._sparse_forward(variable, embedding)
        self._tables = [m for m in module.modules() if isinstance(m, Embedding)]
        for table in self._tables:
            table._attach(cluster, create)

    def _create(self, variable, p, optimizer, partitioner, partition_min_bytes, max_shards):
        nbytes = p.numel() * p.element_size()
        if partitioner is not None:
            pass  # the caller's
        elif p.dim() >= 2 and p.shape[0] >= 2 and nbytes >= partition_min_bytes:
            shards = max(1, min(max_shards, p.shape[0], nbytes // max(1, partition_min_bytes // 4)))
            partitioner = _capstan.Partitioner.fixed_shards(int(shards))
        else:
            partitioner = _capstan.Partitioner.none()
        try:
            self.cluster.create_variable(variable, p.detach(), optimizer, partitioner)
        except _capstan.AlreadyExistsError:
            pass  # another process made it (or this one, before a restart): train on from its values

    def _sparse_forward(self, variable, embedding):
        def forward(ids):
            unique, inverse = _torch.unique(ids, return_inverse=True)
            rows = as_tensor(self.cluster.gather(variable, unique.numpy())).requires_grad_()
            self._gathered.setdefault(variable, []).append((unique, rows))
            return _functional.embedding(inverse, rows, None, None, embedding.norm_type,
                                         embedding.scale_grad_by_freq, False)
        return forward

    def _all(self, calls):
        """Runs the (function, args) calls at once (each releases the GIL
        while its RPC goes); their results in order, the first error raised."""
        futures = [self._rpcs.submit(f, *a) for f, a in calls]
        return [f.result() for f in futures]

    def pull(self):
        """The dense parameters' values from the parameter servers (all read
        at once)."""
        values = self._all([(self.cluster.read_variable, (variable,)) for variable, _ in self._dense])
        with _torch.no_grad():
            for (_, p), value in zip(self._dense, values):
                p.copy_(as_tensor(value).view_as(p))

    def push(self):
        """Every gradient of this step to the parameter servers (all sent at
        once)."""
        calls = [(self.cluster.apply_gradients, (variable, p.grad)) for variable, p in self._dense
                 if p.grad is not None]
        for variable, embedding in self._sparse:
            calls += self._rows_call(variable, self._gathered.pop(variable, []))
        for table in self._tables:
            calls += self._rows_call(table.name, table._take_gathered())
        self._gathered.clear()
        self._all(calls)

    def _rows_call(self, variable, gathered):
        pieces = [(ids, rows.grad) for ids, rows in gathered if rows.grad is not None]
        if not pieces:
            return []
        ids = _torch.cat([i for i, _ in pieces])
        grads = _torch.cat([g for _, g in pieces])
        if len(pieces) > 1:  # one row per id (lookups of one table in a step add up)
            ids, inverse = _torch.unique(ids, return_inverse=True)
            grads = _torch.zeros(len(ids), grads.shape[1], dtype=grads.dtype).index_add_(0, inverse, grads)
        return [(self.cluster.apply_sparse_gradients, (variable, ids.numpy(), grads))]

    def step(self, loss_fn):
        self.pull()
        for p in self.module.parameters():
            p.grad = None
        self._gathered.clear()
        for table in self._tables:
            table._take_gathered()
        loss = loss_fn()
        loss.backward()
        self.push()
        return float(loss.detach())


class Embedding(_torch.nn.Module):
    """A dynamic embedding table on the parameter servers (TFRA's dynamic
    embedding; Capstan's embedding tables): ids of any int64 value, a row
    made by `initializer` when an id is first seen, rows gathered per batch
    and updated sparsely by `optimizer` on the parameter servers. For a
    module trained through PsModule (which attaches the cluster)."""

    def __init__(self, name, dim, initializer=None, optimizer=None, options=None):
        super().__init__()
        self.name = name
        self.dim = dim
        self._initializer = initializer if initializer is not None else _capstan.EmbeddingInitializer.random_normal()
        self._optimizer = optimizer if optimizer is not None else _capstan.Optimizer.sgd(0.01)
        self._options = options if options is not None else _capstan.EmbeddingTableOptions()
        self._cluster = None
        self._gathered = []

    def _attach(self, cluster, create):
        self._cluster = cluster
        if create:
            try:
                cluster.create_embedding_table(self.name, self.dim, "float32", self._initializer, self._optimizer,
                                               self._options)
            except _capstan.AlreadyExistsError:
                pass

    def _take_gathered(self):
        out, self._gathered = self._gathered, []
        return out

    def forward(self, ids):
        if self._cluster is None:
            raise RuntimeError(f"capstan.torch.Embedding '{self.name}' is not attached to a cluster: train the "
                               "module through capstan.torch.PsModule")
        unique, inverse = _torch.unique(ids.to(_torch.int64), return_inverse=True)
        rows = as_tensor(self._cluster.lookup(self.name, unique.numpy())).requires_grad_()
        self._gathered.append((unique, rows))
        return _functional.embedding(inverse, rows)
