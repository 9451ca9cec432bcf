"""capstan.data.service: tf.data.experimental.service.

    dataset_id = capstan.data.service.register_dataset("127.0.0.1:7500", dataset)
    for batch in capstan.data.service.from_dataset_id("127.0.0.1:7500", dataset_id,
                                                       processing_mode="dynamic", job_name="train"):
        ...

processing_mode: "off", "dynamic", "file", "data", "file_or_data", "hint"
(TF's ShardingPolicy). job_name shares one job between readers;
consumer_index/num_consumers make coordinated reads; trainer_id with
cross_trainer_cache shares elements between trainers. Elements arrive as
numpy arrays over the received buffers (no copy of the tensor bytes).
"""

from ._capstan import from_dataset_id, register_dataset  # noqa: F401


def distribute(dataset, dispatcher, *, token="", **read_options):
    """tf.data.experimental.service.distribute: registers `dataset` and reads
    it back through the service (`read_options` as from_dataset_id's).
    Operations applied to the result run in this process."""
    dataset_id = register_dataset(dispatcher, dataset, token=token)
    return from_dataset_id(dispatcher, dataset_id, token=token, **read_options)
