"""capstan.data.service: tf.data.experimental.service.

    dataset_id = capstan.data.service.register_dataset("127.0.0.1:7500", dataset)
    for batch in capstan.data.service.from_dataset_id("127.0.0.1:7500", dataset_id,
                                                       processing_mode="dynamic", job_name="train"):
        ...

processing_mode: "off", "dynamic", "file", "data", "file_or_data", "hint"
(TF's ShardingPolicy). compression (register_dataset, distribute):
"AUTO" (the default, as in TF: zstd where it pays, never to a reader on
the data worker's host), "ZSTD", or None for none; the dataset's, for all
its jobs. job_name shares one job between readers;
consumer_index/num_consumers make coordinated reads; trainer_id with
cross_trainer_cache shares elements between trainers. Elements arrive as
numpy arrays over the received buffers (no copy of the tensor bytes).
"""

from ._capstan import from_dataset_id, register_dataset  # noqa: F401


def distribute(dataset, dispatcher, *, token="", compression="AUTO", **read_options):
    """tf.data.experimental.service.distribute: registers `dataset` (with
    `compression`) and reads it back through the service (`read_options` as
    from_dataset_id's). Operations applied to the result run in this
    process."""
    dataset_id = register_dataset(dispatcher, dataset, token=token, compression=compression)
    return from_dataset_id(dispatcher, dataset_id, token=token, **read_options)
