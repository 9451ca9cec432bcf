"""Pipelines and the data service from Python: values, the zero-copy path,
module functions, Ctrl-C while waiting for an element (the torch adapter and
DLPack: test_torch.py)."""

import os
import pathlib
import signal
import threading
import time
import tracemalloc

import numpy as np
import pytest

import capstan
from capstan.data import Dataset, Fn
from conftest import TEST_MODULE


def test_pipeline_ops_iterate_as_tuples_of_numpy_arrays(tmp_path):
    xs = np.arange(12, dtype=np.float32).reshape(6, 2)
    ys = np.array([b"a", b"b", b"c", b"d", b"e", b"f"])
    batches = list(Dataset.from_tensor_slices((xs, ys)).skip(1).take(4).batch(2))
    assert len(batches) == 2
    np.testing.assert_array_equal(batches[0][0], xs[1:3])
    assert list(batches[1][1]) == [b"d", b"e"]
    shuffled = [int(x) for (x,) in Dataset.range(100).shuffle(100, seed=7)]
    assert sorted(shuffled) == list(range(100)) and shuffled != list(range(100))
    lines = tmp_path / "a.csv"
    lines.write_text("1,x\n2,y\n")
    parsed = list(capstan.data.TextLineDataset(str(lines)).map(Fn.decode_csv([np.int64(0), b""])))
    assert [(int(a), bytes(b.item())) for a, b in parsed] == [(1, b"x"), (2, b"y")]
    (cast,) = next(iter(Dataset.range(5).map(Fn.cast(np.float32)).batch(5)))
    assert cast.dtype == np.float32 and list(cast) == [0, 1, 2, 3, 4]


def test_enumerate_pairs_each_element_with_its_index_from_start():
    xs = np.array([b"a", b"b", b"c"])
    got = [(int(i), bytes(x.item())) for i, x in Dataset.from_tensor_slices((xs,)).enumerate(start=4)]
    assert got == [(4, b"a"), (5, b"b"), (6, b"c")]
    indices, values = next(iter(Dataset.range(10, 15).enumerate().batch(5)))
    assert indices.dtype == np.int64 and list(indices) == [0, 1, 2, 3, 4]
    assert list(values) == [10, 11, 12, 13, 14]
    assert Dataset.range(7).enumerate().cardinality() == 7
    assert "enumerate(2)" in repr(Dataset.range(3).enumerate(2))
    with pytest.raises(capstan.OutOfRangeError, match="INT64_MAX"):
        list(Dataset.range(2).enumerate(start=2**63 - 1))


def test_unbatch_splits_batches_back_into_elements():
    assert [int(x) for (x,) in Dataset.range(7).batch(3).unbatch()] == list(range(7))
    xs = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int64)
    ys = np.array([b"a", b"b", b"c"])
    got = [(list(x), bytes(y.item())) for x, y in Dataset.from_tensors((xs, ys)).unbatch()]
    assert got == [([1, 2], b"a"), ([3, 4], b"b"), ([5, 6], b"c")]
    assert Dataset.range(10).batch(5, drop_remainder=True).unbatch().cardinality() == 10
    assert "unbatch()" in repr(Dataset.range(3).batch(2).unbatch())
    with pytest.raises(capstan.InvalidArgumentError, match="Component 0 had size 3 but component 1 had size 2"):
        list(Dataset.from_tensors((xs, ys[:2])).unbatch())


def test_inputs_and_failures_become_values_or_errors_never_a_crash():
    # Big-endian input is converted, not reinterpreted.
    assert [int(x) for (x,) in Dataset.from_tensor_slices(np.arange(3, dtype=">i4"))] == [0, 1, 2]
    assert [int(x) for (x,) in Dataset.range(5, step=2)] == [0, 2, 4]
    with pytest.raises(ValueError):  # numpy's own error for a ragged list
        Dataset.from_tensors(([[1], [1, 2]],))  # one component, ragged
    with pytest.raises(capstan.InvalidArgumentError, match="seed"):
        Dataset.range(3).shuffle(3, seed=-1)
    with pytest.raises(capstan.InvalidArgumentError, match="x"):
        Fn.parse_example({"x": "fixed"})
    with pytest.raises(capstan.InvalidArgumentError, match="call_timeout"):
        capstan.ClusterCoordinator.connect("127.0.0.1:1", call_timeout=float("inf"))
    # A module function that throws a C++ exception is an error of the read.
    capstan.load_module(TEST_MODULE)
    with pytest.raises(capstan.InternalError, match="threw"):
        list(Dataset.range(3).map(Fn.cast(np.float32)).map(Fn.named("plus_one")))
    # A definition pickles (DataLoader workers, multiprocessing).
    import pickle
    again = pickle.loads(pickle.dumps(Dataset.range(4).batch(2)))
    assert [list(b) for (b,) in again] == [[0, 1], [2, 3]]


def test_two_threads_share_one_iterator_and_each_element_goes_to_one():
    it = Dataset.range(2000).make_iterator()
    got = [[], []]

    def read(i):
        for (x,) in it:
            got[i].append(int(x))

    threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert sorted(got[0] + got[1]) == list(range(2000))


def test_module_functions_and_iterator_state():
    capstan.load_module(TEST_MODULE)
    assert [int(x) for (x,) in Dataset.range(3).map(Fn.named("plus_one"))] == [1, 2, 3]
    it = Dataset.range(10).make_iterator()
    assert int(next(it)[0]) == 0
    state = it.save()
    again = Dataset.range(10).make_iterator()
    again.restore(state)
    assert [int(x) for (x,) in again] == list(range(1, 10))
    assert it.get_next()[0] == 1


def test_data_service_read_of_100k_elements(data_service):
    dataset_id = capstan.data.service.register_dataset(data_service, Dataset.range(100_000))
    read = capstan.data.service.from_dataset_id(data_service, dataset_id, processing_mode="off")
    values = np.fromiter((x for (x,) in read), dtype=np.int64, count=100_000)
    np.testing.assert_array_equal(np.sort(values), np.arange(100_000))
    # distribute() is register + read; a shared, named job.
    distributed = capstan.data.service.distribute(Dataset.range(1000).batch(100), data_service,
                                                  processing_mode="dynamic", job_name="shared")
    assert sorted(int(v) for (b,) in distributed for v in b) == list(range(1000))


def test_data_service_compression_values_give_the_same_elements(data_service):
    lines = np.array([b"39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, <=50K"] * 64)
    dataset = Dataset.from_tensor_slices((lines, np.arange(64, dtype=np.int64))).batch(16)
    expected = [(list(a), list(b)) for (a, b) in dataset]
    for compression in ("AUTO", "ZSTD", "zstd", None):
        read = capstan.data.service.distribute(dataset, data_service, compression=compression)
        assert [(list(a), list(b)) for (a, b) in read] == expected, compression
    # ZSTD gets its own dataset id (the compression is the dataset's).
    auto_id = capstan.data.service.register_dataset(data_service, dataset)
    assert capstan.data.service.register_dataset(data_service, dataset, compression="ZSTD") != auto_id
    with pytest.raises(capstan.InvalidArgumentError, match="'snappy'.*AUTO.*NONE.*ZSTD"):
        capstan.data.service.distribute(dataset, data_service, compression="snappy")


def test_one_mib_elements_arrive_without_a_copy(data_service):
    element = np.arange(1 << 20, dtype=np.uint8)
    dataset_id = capstan.data.service.register_dataset(data_service, Dataset.from_tensors((element,)).repeat(40))
    read = capstan.data.service.from_dataset_id(data_service, dataset_id)
    tracemalloc.start()
    try:
        kept = [x for (x,) in read]  # 40 MiB of elements, all alive
        numpy_bytes, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(kept) == 40
    for x in kept:
        assert x.nbytes == 1 << 20 and not x.flags.owndata and not x.flags.writeable
        # A capstan.Array over an array whose base holds the received tensor.
        assert isinstance(x, capstan.Array) and type(x.base.base).__name__ == "PyCapsule"
    np.testing.assert_array_equal(kept[17], element)
    # The same tensor twice (a memory cache hands out its one tensor on each
    # pass): two arrays over one buffer. A copy anywhere on the way to
    # Python would part them.
    first, second = (x for (x,) in Dataset.from_tensors((element,)).cache().repeat(2))
    assert np.shares_memory(first, second)
    # numpy (traced by tracemalloc) allocated none of the 40 MiB: the arrays
    # are views of the buffers the SDK received.
    assert numpy_bytes < (1 << 20), f"{numpy_bytes} bytes allocated by Python for 40 MiB of elements"


def test_ctrl_c_interrupts_a_read_waiting_for_elements_and_keeps_the_iterator(cluster):
    dispatcher = cluster.start("data-dispatcher")  # no data worker yet: reads wait
    dataset_id = capstan.data.service.register_dataset(dispatcher.address, Dataset.range(5))
    it = capstan.data.service.from_dataset_id(dispatcher.address, dataset_id, job_name="wait").make_iterator()
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        it.get_next()
    assert time.monotonic() - started < 5
    # The read goes on once a data worker serves the job: nothing was lost.
    cluster.start("data-worker", "--dispatcher", dispatcher.address)
    assert sorted(int(x) for (x,) in it) == [0, 1, 2, 3, 4]


SHARED_TESTDATA = pathlib.Path(os.environ.get("CAPSTAN_SHARED_TESTDATA",
                                              pathlib.Path(__file__).resolve().parents[3] / "shared" / "testdata"))


# The checkout's ../shared/testdata (CI has it beside its clone); a clone
# elsewhere has none, as the C++ shared-testdata tests, which are then not
# registered at all.
@pytest.mark.skipif(not (SHARED_TESTDATA / "tfrecord").is_dir(),
                    reason=f"{SHARED_TESTDATA} not found (the checkout's ../shared/testdata)")
def test_tfrecord_files_written_by_tensorflow_parse_into_arrays():
    testdata = SHARED_TESTDATA
    features = {"x_float": ("fixed", np.float32, [10]), "x_int": ("fixed", np.int64, [10]),
                "x_byte": ("fixed", np.bytes_, [1])}
    (batch,) = list(capstan.data.TFRecordDataset(str(testdata / "tfrecord" / "example.tfrecord"))
                    .batch(4).map(Fn.parse_example(features)))
    x_byte, x_float, x_int = batch  # outputs in key order
    np.testing.assert_array_equal(x_float, np.arange(40, dtype=np.float32).reshape(4, 10))
    np.testing.assert_array_equal(x_int, np.arange(0, 400, 10).reshape(4, 10))
    assert x_byte.shape == (4, 1) and x_byte[3, 0] == b"test str"


def test_data_service_dynamic_read_survives_a_data_worker_killed_for_good(cluster):
    # Issue 37's reproduction: a data worker killed (SIGKILL) and never
    # restarted. The dispatcher declares it lost after --worker-timeout-ms
    # and moves its task to the survivor, which replays the task's splits and
    # skips what this reader has: every element once, then the end (it used
    # to stop at 19,991 elements and wait forever).
    dispatcher = cluster.start("data-dispatcher", "--worker-timeout-ms", "2000")
    workers = [cluster.start("data-worker", "--dispatcher", dispatcher.address, "--task-index", str(i))
               for i in range(2)]
    dataset_id = capstan.data.service.register_dataset(dispatcher.address, Dataset.range(20_000).batch(1))
    read = iter(capstan.data.service.from_dataset_id(dispatcher.address, dataset_id, processing_mode="dynamic"))
    values = [int(next(read)[0][0]) for _ in range(5000)]
    workers[1].process.send_signal(signal.SIGKILL)
    workers[1].process.wait(timeout=10)
    killed = time.monotonic()
    values += [int(b[0]) for (b,) in read]
    print(f"end of sequence {time.monotonic() - killed:.1f} s after the kill (--worker-timeout-ms 2000)")
    assert len(values) == 20_000
    assert sorted(values) == list(range(20_000))
