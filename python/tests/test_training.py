"""The coordinator cycle from Python, with the C++ training module on the
workers: variables, schedule/join/done/fetch, per-worker datasets,
checkpoints, embedding tables, errors, Ctrl-C and the GIL."""

import os
import signal
import threading
import time

import numpy as np
import pytest

import capstan
from conftest import wait_until


def test_schedule_join_fetch_and_variables(training):
    info = training.create_variable("counter", np.float32(0), capstan.Optimizer.sgd(0.1))
    assert info.name == "counter" and info.dtype == "float32" and info.shape == ()
    values = [training.schedule("add_one") for _ in range(20)]
    training.join()
    assert training.done()
    assert training.read_variable("counter") == 20
    # Each closure's value (its worker's index), fetched from the RemoteValue.
    workers = {v.fetch()[0].item() for v in values}
    assert workers <= {0, 1}
    assert training.fetch(values[0])[0].dtype == np.int64
    training.assign_variable("counter", np.float32(5))
    assert training.read_variable("counter") == 5


def test_partitioned_variable_gather_and_sparse_update(training):
    table = np.arange(24, dtype=np.float32).reshape(6, 4)
    info = training.create_variable("emb", table, capstan.Optimizer.sgd(1.0), capstan.Partitioner.fixed_shards(2))
    assert info.num_shards == 2
    rows = training.gather("emb", np.array([5, 0]))
    np.testing.assert_array_equal(rows, table[[5, 0]])
    # A closure applies a sparse SGD step of 1.0 on rows 1 and 4.
    training.schedule("sparse_step", (np.ones((2, 4), np.float32), np.array([1, 4], np.int64))).fetch()
    expected = table.copy()
    expected[[1, 4]] -= 1
    np.testing.assert_array_equal(training.read_variable("emb"), expected)


def test_variable_made_by_an_initializer_on_the_parameter_servers(training):
    init = capstan.Initializer.glorot_uniform(7)
    assert init.kind == "glorot_uniform"
    info = training.create_variable("k", optimizer=capstan.Optimizer.sgd(0.1),
                                    partitioner=capstan.Partitioner.fixed_shards(2), initializer=init,
                                    dtype="float32", shape=[10, 4])
    assert info.num_shards == 2 and info.shape == (10, 4)
    value = training.read_variable("k")
    limit = np.sqrt(6 / (10 + 4))
    assert value.dtype == np.float32 and np.all(np.abs(value) <= limit) and value.std() > 0
    # The same initializer unpartitioned: the same tensor.
    training.create_variable("k1", initializer=init, dtype="float32", shape=[10, 4])
    np.testing.assert_array_equal(training.read_variable("k1"), value)
    with pytest.raises(capstan.InvalidArgumentError):
        training.create_variable("bad", initializer=capstan.Initializer.random_normal(0, -1), dtype="float32",
                                 shape=[2])
    with pytest.raises(capstan.InvalidArgumentError):
        training.create_variable("both", np.zeros(2, np.float32), initializer=capstan.Initializer.zeros())


def test_per_worker_datasets_from_a_pipeline_and_a_dataset_function(training):
    pipeline = capstan.data.Dataset.range(20).shard(capstan.data.SHARD_HINT, capstan.data.SHARD_HINT)
    for dataset in (training.create_per_worker_dataset(pipeline),
                    training.create_per_worker_dataset("sharded_range")):
        # Closures go to whichever worker is free (one may take many while
        # the other is busy), so they are scheduled in rounds until both
        # shards are read.
        by_worker = {0: [], 1: []}
        for _ in range(100):
            values = [training.schedule("next_element", (dataset.arg(),)) for _ in range(8)]
            for v in values:
                value, worker = v.fetch()
                if value.item() >= 0:
                    by_worker[worker.item()].append(value.item())
            if sum(len(s) for s in by_worker.values()) >= 20:
                break
        # Each worker reads its own shard (2 workers: worker w gets w, w + 2, ...), in order, once.
        for worker, seen in by_worker.items():
            assert seen == list(range(worker, 20, 2))


def test_checkpoint_save_and_restore(training, tmp_path):
    training.create_variable("counter", np.float32(0), capstan.Optimizer.sgd(0.1))
    for _ in range(3):
        training.schedule("add_one")
    training.join()
    path = training.save_checkpoint(str(tmp_path / "ckpt"), 3)
    assert path.endswith("ckpt-3")
    training.assign_variable("counter", np.float32(100))
    assert training.restore_checkpoint(str(tmp_path / "ckpt")) == 3
    assert training.read_variable("counter") == 3


def test_embedding_table(training):
    training.create_embedding_table("users", 8, "float32", capstan.EmbeddingInitializer.random_normal(0, 0.1, 3),
                                    capstan.Optimizer.sgd(1.0))
    ids = np.array([1 << 40, 7, 1 << 40], np.int64)
    rows = training.lookup("users", ids)
    assert rows.shape == (3, 8)
    np.testing.assert_array_equal(rows[0], rows[2])
    training.apply_sparse_gradients("users", ids[:2], np.ones((2, 8), np.float32))
    np.testing.assert_allclose(training.lookup("users", ids[:1], insert=False), rows[:1] - 1, rtol=1e-6)
    np.testing.assert_array_equal(training.lookup("users", np.array([99]), insert=False), np.zeros((1, 8)))


def test_errors_are_exceptions_with_their_codes(training):
    with pytest.raises(capstan.NotFoundError) as e:
        training.read_variable("nope")
    assert e.value.code == "NotFound"
    assert isinstance(e.value, capstan.Error)
    training.create_variable("w", np.zeros(2, np.float32))
    with pytest.raises(capstan.AlreadyExistsError):
        training.create_variable("w", np.zeros(3, np.float32))
    with pytest.raises(capstan.InvalidArgumentError):
        training.gather("w", np.array([0.5]))
    # The first closure error is raised by join, as in TF.
    training.schedule("fail")
    with pytest.raises(capstan.InvalidArgumentError, match="always fails"):
        training.join()
    with pytest.raises(capstan.InvalidArgumentError):
        capstan.data.Dataset.range(3).batch(0).make_iterator()
    with pytest.raises(capstan.UnavailableError):
        capstan.ClusterCoordinator.connect("127.0.0.1:1", connect_timeout=0.3)


def test_ctrl_c_interrupts_a_blocking_join_and_the_gil_is_released(training):
    training.create_variable("counter", np.float32(0), capstan.Optimizer.sgd(0.1))
    training.schedule("sleep_then_tag", (np.int64(3000), np.int64(1)))
    ticks = []
    stop = threading.Event()

    def tick():  # runs only if join() released the GIL
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            training.join()
    finally:
        stop.set()
        ticker.join()
        timer.cancel()
    assert time.monotonic() - started < 2.5  # the closure sleeps 3 s
    assert len(ticks) > 50
    training.join()  # the closure still finishes
    assert training.read_variable("counter") == 1


def test_collectives_on_numpy_arrays(training):
    # Two ranks in this process (each call releases the GIL while it waits
    # for the other).
    results = {}

    def rank(r):
        group = training.join_group("py-group", size=2, rank=r, timeout=20)
        assert (group.rank, group.size) == (r, 2)
        results[r] = (group.all_reduce(np.full(3, r + 1, np.float32), "sum"),
                      group.all_reduce(np.full(2, r + 1.0), "mean"),
                      group.broadcast(np.full(2, r, np.int64), root=1),
                      group.all_gather(np.array([[r, r]], np.int32)))
        group.barrier()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for r in range(2):
        total, mean, broadcast, gathered = results[r]
        np.testing.assert_array_equal(total, [3, 3, 3])
        np.testing.assert_array_equal(mean, [1.5, 1.5])
        np.testing.assert_array_equal(broadcast, [1, 1])
        np.testing.assert_array_equal(gathered, [[0, 0], [1, 1]])


def test_a_closure_error_taken_by_an_interrupted_join_is_raised_by_the_next(training):
    training.create_variable("counter", np.float32(0), capstan.Optimizer.sgd(0.1))
    training.schedule("sleep_then_tag", (np.int64(1500), np.int64(1)))
    training.schedule("fail", (np.int64(1000),))
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        training.join()
    time.sleep(2)  # the interrupted join has taken the error by now
    with pytest.raises(capstan.InvalidArgumentError, match="always fails"):
        training.join()


def test_dropped_and_fetched_once_values_are_released(cluster):
    # A RemoteValue that Python garbage-collects is released at the
    # coordinator, as TF frees a RemoteValue's result with the object; so is
    # one fetched with fetch_once (issue 37: the coordinator used to keep
    # every value forever).
    import gc
    import urllib.request

    from conftest import TRAINING_MODULE

    ps = cluster.start("ps-server", "--task-index", "0")
    coordinator = cluster.start("coordinator", "--ps", ps.address)
    cluster.start("worker-server", "--coordinator", coordinator.address, "--module", TRAINING_MODULE)
    client = capstan.ClusterCoordinator.connect(coordinator.address)
    assert wait_until(lambda: client.num_workers() == 1)
    client.create_variable("counter", np.float32(0), capstan.Optimizer.sgd(0.1))

    def kept():
        url = f"http://127.0.0.1:{coordinator.http_port}/metrics"
        for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
            if line.startswith("capstan_coordinator_results_kept "):
                return float(line.split()[1])
        return -1

    values = [client.schedule("add_one") for _ in range(50)]
    client.join()
    held, once = values[:10], values[10]
    del values
    gc.collect()
    assert once.fetch_once()[0].dtype == np.int64
    with pytest.raises(capstan.NotFoundError, match="released"):
        once.fetch()
    # The 39 dropped and the one fetched once go; the 10 held stay.
    assert wait_until(lambda: kept() == 10, timeout=20), kept()
    assert all(v.fetch()[0].item() == 0 for v in held)


def test_an_optimizer_with_a_learning_rate_schedule():
    schedules = capstan.LearningRateSchedule
    adam = capstan.Optimizer.adam(0.001).with_schedule(schedules.cosine_decay(100, alpha=0.1))
    assert adam.schedule.kind == "cosine_decay"
    assert adam.learning_rate_at(0) == pytest.approx(0.001)
    assert adam.learning_rate_at(50) == pytest.approx(0.001 * (0.9 * 0.5 + 0.1))
    assert adam.learning_rate_at(1000) == pytest.approx(0.0001)
    # piecewise_constant_decay's first value becomes the learning rate.
    sgd = capstan.Optimizer.sgd(1.0).with_schedule(schedules.piecewise_constant_decay([10], [0.5, 0.1]))
    assert sgd.learning_rate == 0.5
    assert (sgd.learning_rate_at(10), sgd.learning_rate_at(11)) == (0.5, 0.1)
