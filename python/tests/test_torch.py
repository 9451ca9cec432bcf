"""capstan with real PyTorch (Debian's python3-torch): capstan.torch's
IterableDataset in a DataLoader, DLPack both ways (capstan.Array out to
torch and numpy with no copy, torch tensors in), and the numpy check that
refuses to load the module under a numpy it would misread."""

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.utils.data

import capstan
import capstan.torch
from capstan.data import Dataset


def data_pointer(array):
    return array.__array_interface__["data"][0]


def test_dataloader_reads_a_pipeline_as_tensors_over_capstan_buffers():
    loader = torch.utils.data.DataLoader(capstan.torch.IterableDataset(Dataset.range(10).batch(4)),
                                         batch_size=None)
    batches = list(loader)
    assert all(isinstance(b, torch.Tensor) for (b,) in batches)
    assert [b.tolist() for (b,) in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # A cached tensor handed out twice: two torch tensors over its one
    # buffer (a copy anywhere on the way would part them).
    element = np.arange(1 << 16, dtype=np.float32)
    first, second = (t for (t,) in capstan.torch.IterableDataset(Dataset.from_tensors((element,)).cache().repeat(2)))
    assert first.data_ptr() == second.data_ptr()
    assert torch.equal(first, torch.from_numpy(element))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores: on purpose
@pytest.mark.parametrize("workers", [2, 3])
def test_dataloader_workers_each_read_a_shard_and_every_element_comes_once(workers):
    dataset = capstan.torch.IterableDataset(Dataset.range(100).batch(5))
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    values = sorted(v for (b,) in loader for v in b.tolist())
    assert values == list(range(100))
    # shard=False: each worker reads the whole pipeline, as any IterableDataset.
    unsharded = capstan.torch.IterableDataset(Dataset.range(10), shard=False)
    values = sorted(int(x) for (x,) in torch.utils.data.DataLoader(unsharded, batch_size=None, num_workers=2))
    assert values == sorted(list(range(10)) * 2)


def test_dataloader_workers_share_a_data_service_job_and_every_element_comes_once(data_service):
    dataset_id = capstan.data.service.register_dataset(data_service, Dataset.range(200).batch(10))
    read = capstan.data.service.from_dataset_id(data_service, dataset_id, processing_mode="dynamic",
                                                job_name="torch-loader")
    loader = torch.utils.data.DataLoader(capstan.torch.IterableDataset(read), batch_size=None, num_workers=2)
    values = sorted(v for (b,) in loader for v in b.tolist())
    assert values == list(range(200))


def test_arrays_from_the_data_service_and_fetched_values_go_to_torch_and_numpy_without_a_copy(data_service,
                                                                                                training):
    element = np.arange(1 << 20, dtype=np.float32)
    dataset_id = capstan.data.service.register_dataset(data_service, Dataset.from_tensors((element,)).repeat(3))
    arrays = [x for (x,) in capstan.data.service.from_dataset_id(data_service, dataset_id)]
    training.create_variable("counter", np.float32(0), capstan.Optimizer.sgd(0.1))
    value = training.schedule("add_one")
    training.join()
    fetched, = value.fetch()
    for array in arrays + [fetched, training.read_variable("counter")]:
        assert isinstance(array, capstan.Array) and not array.flags.writeable
        tensor = torch.from_dlpack(array)
        assert tensor.data_ptr() == data_pointer(array)
        assert np.shares_memory(np.from_dlpack(array), array)
        np.testing.assert_array_equal(tensor.numpy(), array)
    assert torch.equal(torch.from_dlpack(arrays[0]), torch.from_numpy(element))
    # A tensor keeps the buffer alive after the array is gone.
    tensor = torch.from_dlpack(arrays.pop())
    del array
    arrays.clear()
    assert tensor[12345].item() == 12345.0
    # Views stay Capstan arrays over the same buffer; results of arithmetic
    # are plain numpy, as from any array.
    view = fetched.reshape(1) if fetched.ndim == 0 else fetched[:1]
    assert isinstance(view, capstan.Array) and np.shares_memory(view, fetched)
    assert type(fetched + 1) is not capstan.Array


def test_dlpack_refuses_what_it_cannot_describe():
    flags, = next(iter(Dataset.from_tensors((np.array([True, False]),))))
    with pytest.raises(capstan.InvalidArgumentError, match="bool.*uint8"):
        torch.from_dlpack(flags)
    numbers, = next(iter(Dataset.from_tensors((np.arange(4.0),))))
    with pytest.raises(BufferError, match="host memory"):
        numbers.__dlpack__(stream=1)
    assert numbers.__dlpack_device__() == (1, 0)


def test_collectives_and_variable_writes_take_torch_tensors(training):
    inputs = [torch.full((3,), 1.0), torch.full((3,), 2.0)]

    def rank(r):
        group = training.join_group("torch-group", size=2, rank=r, timeout=20)
        # Read in place (no copy going in), and left as it was.
        result = group.all_reduce(inputs[r], "sum")
        assert inputs[r].tolist() == [r + 1.0] * 3
        assert data_pointer(result) != inputs[r].data_ptr()
        return result

    results, errors = _run_ranks(2, rank)
    assert not errors, errors
    for r in range(2):
        np.testing.assert_array_equal(results[r], [3, 3, 3])
    weights = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    training.create_variable("w", weights, capstan.Optimizer.sgd(1.0))
    np.testing.assert_array_equal(training.read_variable("w"), weights.numpy())
    training.assign_variable("w", torch.zeros(3, 2))
    np.testing.assert_array_equal(training.read_variable("w"), np.zeros((3, 2), np.float32))
    # A tensor that requires grad is refused as torch refuses it: detach first.
    with pytest.raises(RuntimeError, match="detach"):
        training.assign_variable("w", torch.zeros(3, 2, requires_grad=True))


def test_all_reduce_and_broadcast_in_place_on_torch_tensors(training):
    def rank(r):
        group = training.join_group("torch-inplace", size=2, rank=r, timeout=20)
        t = torch.arange(6, dtype=torch.float64).reshape(2, 3) * (r + 1)
        before = t.data_ptr()
        assert capstan.torch.all_reduce_(t, group, "mean") is t
        assert t.data_ptr() == before
        b = torch.full((4,), float(r), dtype=torch.bfloat16)
        capstan.torch.broadcast_(b, group, root=1)
        h = torch.full((3,), 0.5 * (r + 1), dtype=torch.bfloat16)
        capstan.torch.all_reduce_(h, group, "sum")
        return t, b, h

    results, errors = _run_ranks(2, rank)
    assert not errors, errors
    for r in range(2):
        t, b, h = results[r]
        torch.testing.assert_close(t, torch.arange(6, dtype=torch.float64).reshape(2, 3) * 1.5)
        assert b.dtype == torch.bfloat16 and b.tolist() == [1.0] * 4
        assert h.dtype == torch.bfloat16 and h.tolist() == [1.5] * 3


def test_collectives_refuse_a_device_they_cannot_take_and_ddp_a_module_on_several(training):
    group = training.join_group("torch-refused", size=1, rank=0, timeout=20)
    with pytest.raises(ValueError, match="is on meta.*CUDA tensors \\(NCCL\\)"):
        capstan.torch.all_reduce_(torch.empty(3, device="meta"), group)
    with pytest.raises(ValueError, match="all on the CPU or all on one CUDA device"):
        capstan.torch.DistributedDataParallel(torch.nn.Linear(2, 2, device="meta"), group,
                                              broadcast_parameters=False)
    # The device calls themselves check their arguments before NCCL: here
    # (no GPU) a good call says why CUDA collectives cannot run.
    why = capstan.Communicator.device_collectives()
    assert isinstance(why, str) and why
    with pytest.raises(capstan.InvalidArgumentError, match="count -1 is negative"):
        group._all_reduce_device(0, -1, "float32")
    with pytest.raises(capstan.InvalidArgumentError, match="dtype 'string'"):
        group._all_reduce_device(8, 4, "string")
    with pytest.raises(capstan.InvalidArgumentError, match="reduce op 'avg'"):
        group._all_reduce_device(8, 4, "float32", "avg")
    with pytest.raises(capstan.InvalidArgumentError, match="address 0 for 4 elements"):
        group._all_reduce_device(0, 4, "float32")
    with pytest.raises(capstan.Error):
        group._all_reduce_device(8, 4, "float32", "sum", 0, 0)
    # None of it aborted the group.
    assert not group.aborted
    np.testing.assert_array_equal(group.all_reduce(np.ones(2), "sum"), [1, 1])


def test_a_numpy_2_is_refused_at_import_naming_both_numpys(tmp_path):
    # A numpy that says it is 2.x, first on the path: the module was built
    # with pybind11 2.10, which reads numpy 1.x arrays only.
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '2.1.0'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", "import capstan"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert "numpy 2.1.0" in done.stderr and str(fake) in done.stderr
    assert f"numpy {np.__version__}" in done.stderr and "-DPython3_EXECUTABLE=" in done.stderr


def _net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 1))


def _run_ranks(size, target):
    results, errors = {}, {}

    def run(r):
        try:
            results[r] = target(r)
        except BaseException as e:  # noqa: B902 (reported below)
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results, errors


def test_ddp_two_ranks_of_batch_b_equal_one_process_of_batch_2b_after_an_sgd_step(training):
    torch.manual_seed(7)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    reference = _net(1)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    optimizer.step()

    # Made here: torch's seed is global, and the ranks are threads.
    # Rank 1 starts from other values: construction gives it rank 0's.
    nets = [_net(1), _net(2)]

    def rank(r):
        group = training.join_group("ddp-exact", size=2, rank=r, timeout=30)
        model = capstan.torch.DistributedDataParallel(nets[r], group, bucket_cap_mb=100 / (1 << 20))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        part = slice(4 * r, 4 * r + 4)
        torch.nn.functional.mse_loss(model(x[part]), y[part]).backward()
        opt.step()
        return len(model.buckets), [p.detach().clone() for p in model.parameters()]

    results, errors = _run_ranks(2, rank)
    assert not errors, errors
    for r in range(2):
        buckets, params = results[r]
        assert buckets > 1  # 100-byte buckets: several all-reduces during backward
        for got, want in zip(params, reference.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_ddp_no_sync_accumulates_and_unused_parameters_count_as_zero(training):
    torch.manual_seed(3)
    xs = [torch.randn(4, 4) for _ in range(4)]

    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 4)
            self.used = torch.nn.Linear(4, 1)
            self.unused = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.used(self.body(x))

    torch.manual_seed(11)
    nets = [TwoHeads(), TwoHeads()]

    def rank(r):
        group = training.join_group("ddp-accumulate", size=2, rank=r, timeout=30)
        model = capstan.torch.DistributedDataParallel(nets[r], group)
        with model.no_sync():
            model(xs[r]).sum().backward()
        local = model.module.body.weight.grad.clone()
        model(xs[2 + r]).sum().backward()
        return local, model.module.body.weight.grad.clone(), model.module.unused.weight.grad.clone()

    results, errors = _run_ranks(2, rank)
    assert not errors, errors
    torch.manual_seed(11)
    single = TwoHeads()
    grads = []
    for r in range(2):
        single.zero_grad()
        single(xs[r]).sum().backward()
        single(xs[2 + r]).sum().backward()
        grads.append(single.body.weight.grad.clone())
    for r in range(2):
        local, averaged, unused = results[r]
        assert not torch.allclose(local, averaged)  # no_sync kept it local
        torch.testing.assert_close(averaged, (grads[0] + grads[1]) / 2)
        assert torch.count_nonzero(unused) == 0


def test_ddp_backward_fails_naming_a_rank_that_never_joins_the_all_reduce(training):
    joined = threading.Barrier(2)
    x = torch.randn(2, 4)

    nets = [_net(1), _net(1)]

    def rank(r):
        group = training.join_group("ddp-dead", size=2, rank=r, timeout=3)
        model = capstan.torch.DistributedDataParallel(nets[r], group)
        joined.wait()
        if r == 1:
            return "rank 1 stopped before backward"
        started = time.monotonic()
        try:
            model(x).sum().backward()
        finally:
            group.abort("test over")
        return time.monotonic() - started

    results, errors = _run_ranks(2, rank)
    assert 1 in results and 0 in errors, (results, errors)
    assert isinstance(errors[0], capstan.Error), repr(errors[0])
    assert re.search(r"rank\(s\) 1 stopped responding", str(errors[0])), str(errors[0])


class _SparseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.items = torch.nn.Embedding(50, 4, sparse=True)
        self.head = torch.nn.Linear(4 + 3, 1)

    def forward(self, ids, x):
        return self.head(torch.cat([self.items(ids).mean(1), x], 1)).squeeze(1)


def test_ps_module_with_one_process_equals_local_torch_training_step_by_step(training):
    torch.manual_seed(5)
    local = _SparseNet()
    remote = _SparseNet()
    remote.load_state_dict(local.state_dict())
    # Parameters of 200 bytes or more with two or more rows split by rows:
    # the table (800 bytes) is sharded; the head's one-row weight is not.
    ps = capstan.torch.PsModule(remote, training, prefix="sparse/", optimizer=capstan.Optimizer.sgd(0.1),
                                partition_min_bytes=200)
    variables = {v.name: v for v in training.variables()}
    assert variables["sparse/items.weight"].num_shards > 1 and variables["sparse/head.weight"].num_shards == 1
    optimizer = torch.optim.SGD(local.parameters(), lr=0.1)
    for step in range(5):
        ids = torch.randint(0, 50, (8, 3))  # repeated ids within and across rows
        x, y = torch.randn(8, 3), torch.randn(8)
        optimizer.zero_grad()
        want = torch.nn.functional.mse_loss(local(ids, x), y)
        want.backward()
        optimizer.step()
        got = ps.step(lambda: torch.nn.functional.mse_loss(remote(ids, x), y))
        assert abs(got - float(want)) < 1e-5, step
        # The module never held the table: compare with the servers' values.
        torch.testing.assert_close(as_torch(training.read_variable("sparse/items.weight")), local.items.weight.detach(),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(as_torch(training.read_variable("sparse/head.weight")), local.head.weight.detach(),
                                   rtol=1e-5, atol=1e-6)


def as_torch(array):
    return capstan.torch.as_tensor(array)


def test_a_ps_module_checkpoints_through_the_coordinator(training, tmp_path):
    torch.manual_seed(4)
    net = _SparseNet()
    ps = capstan.torch.PsModule(net, training, prefix="ckpt/", optimizer=capstan.Optimizer.adagrad(0.1))
    ids, x, y = torch.randint(0, 50, (8, 3)), torch.randn(8, 3), torch.randn(8)
    ps.step(lambda: torch.nn.functional.mse_loss(net(ids, x), y))
    saved = {name: as_torch(training.read_variable("ckpt/" + name)).clone() for name, _ in net.named_parameters()}
    path = training.save_checkpoint(str(tmp_path), 1)
    # More training moves every value; the restore brings the saved ones back.
    ps.step(lambda: torch.nn.functional.mse_loss(net(ids, x), y))
    assert not torch.equal(as_torch(training.read_variable("ckpt/head.weight")), saved["head.weight"])
    assert training.restore_checkpoint(path) == 1
    ps.pull()
    torch.testing.assert_close(net.head.weight.detach(), saved["head.weight"].view_as(net.head.weight))
    for name, value in saved.items():
        torch.testing.assert_close(as_torch(training.read_variable("ckpt/" + name)), value)


def test_ps_modules_of_two_processes_share_the_variables_and_a_late_one_carries_on(training):
    torch.manual_seed(1)
    first = torch.nn.Linear(3, 1)
    ps_first = capstan.torch.PsModule(first, training, prefix="shared/", optimizer=capstan.Optimizer.sgd(0.5))
    x, y = torch.randn(4, 3), torch.randn(4)
    ps_first.step(lambda: torch.nn.functional.mse_loss(first(x).squeeze(1), y))
    trained = as_torch(training.read_variable("shared/weight")).clone()
    # Another process's module (other initial values) finds the variables
    # and pulls the trained values, not its own.
    torch.manual_seed(2)
    second = torch.nn.Linear(3, 1)
    ps_second = capstan.torch.PsModule(second, training, prefix="shared/", optimizer=capstan.Optimizer.sgd(0.5))
    ps_second.pull()
    torch.testing.assert_close(second.weight.detach(), trained.view_as(second.weight))
    # Both push into the same variables: the first pulls the second's step.
    ps_second.step(lambda: torch.nn.functional.mse_loss(second(x).squeeze(1), y))
    ps_first.pull()
    torch.testing.assert_close(first.weight.detach(), as_torch(training.read_variable("shared/weight")))
    assert not torch.equal(first.weight.detach(), trained.view_as(first.weight))


def test_a_dynamic_embedding_table_trains_the_rows_of_the_ids_it_saw(training):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.users = capstan.torch.Embedding("users", 4, capstan.EmbeddingInitializer.zeros(),
                                                 capstan.Optimizer.sgd(1.0))
            self.head = torch.nn.Linear(4, 1)

        def forward(self, ids):
            return self.head(self.users(ids)).squeeze(1)

    net = Net()
    ps = capstan.torch.PsModule(net, training, prefix="dyn/")
    ids = torch.tensor([10 ** 12, 7, 7, -3])  # any int64 id
    ps.step(lambda: net(ids).sum())
    rows = as_torch(training.lookup("users", np.array([10 ** 12, 7, -3, 99]), insert=False))
    head = as_torch(training.read_variable("dyn/head.weight")).reshape(-1)
    # d(sum)/d(row) = the head's weight (before its own step), once per
    # occurrence; SGD(1.0): the row moves by minus that.
    assert torch.count_nonzero(rows[3]) == 0  # 99 was never seen
    assert torch.all(rows[1] != 0) and torch.allclose(rows[1], 2 * rows[0])  # id 7 came twice
    assert head.shape == (4,)
    with pytest.raises(RuntimeError, match="not attached"):
        capstan.torch.Embedding("loose", 2)(torch.tensor([1]))
