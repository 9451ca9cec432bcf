"""Capstan from Python: parameter-server training, tf.data pipelines and the
tf.data service, and collectives, over Capstan's C++ SDK (libcapstan.so).

    import capstan
    cluster = capstan.ClusterCoordinator.connect("127.0.0.1:7000")
    cluster.create_variable("w", np.zeros((2, 1), np.float32), capstan.Optimizer.adagrad(0.05))
    dataset = cluster.create_per_worker_dataset("input")      # a dataset function of the workers' module
    values = [cluster.schedule("train_step", (dataset.arg(),)) for _ in range(100)]
    cluster.join()                                             # raises the first closure error
    loss, = values[-1].fetch()

    for x, y in capstan.data.Dataset.range(10).map(capstan.data.Fn.named("f")).batch(4):
        ...                                                    # tuples of numpy arrays

Errors raise capstan.Error subclasses named after the status code
(capstan.UnavailableError, capstan.InvalidArgumentError, ...), each with
`.code`. Blocking calls release the GIL; Ctrl-C interrupts join, fetch,
done, collectives and iteration. Arrays that come out are capstan.Array:
numpy arrays that share the tensor's memory (read-only, no copy; their
base keeps it alive) and export it through DLPack (torch.from_dlpack,
numpy.from_dlpack). Arrays go in as anything numpy.asarray takes, or any
DLPack producer (a torch tensor).
"""

from ._capstan import (  # noqa: F401
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    ClusterCoordinator,
    Communicator,
    DataLossError,
    DeadlineExceededError,
    EmbeddingInitializer,
    EmbeddingTableOptions,
    Error,
    FailedPreconditionError,
    Initializer,
    InternalError,
    InvalidArgumentError,
    LearningRateSchedule,
    NotFoundError,
    Optimizer,
    OutOfRangeError,
    Partitioner,
    PerWorkerDataset,
    PermissionDeniedError,
    RemoteValue,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
    VariableInfo,
    load_module,
)
from ._array import Array  # noqa: F401
from . import data  # noqa: F401

__version__ = "0.1.0"
