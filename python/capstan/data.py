"""tf.data for Capstan: capstan.data.Dataset has tf.data.Dataset's methods
and iterates as tuples of numpy arrays; capstan.data.service is
tf.data.experimental.service (register_dataset, from_dataset_id,
distribute).

Functions in pipelines are the built-ins of Fn (decode_csv, parse_example,
cast, tfrecord_dataset, text_line_dataset) or functions a C++ module
registers (Fn.named("parse_row"); capstan.load_module(path) makes them
available to pipelines iterated in this process; data workers and
worker-servers load theirs with --module).
"""

from ._capstan import AUTOTUNE, SHARD_HINT, Dataset, Fn, Iterator  # noqa: F401
from . import _service as service  # noqa: F401


def TFRecordDataset(filenames, compression_type="", buffer_size=None, num_parallel_reads=0):
    """tf.data.TFRecordDataset: the records of the files, as bytes scalars.
    buffer_size is accepted for TF's signature (Capstan sizes its reads)."""
    del buffer_size
    if isinstance(filenames, str):
        filenames = [filenames]
    return Dataset.tfrecord_dataset(list(filenames), compression_type or "", num_parallel_reads or 0)


def TextLineDataset(filenames, compression_type=""):
    """tf.data.TextLineDataset: the lines of the files, as bytes scalars."""
    if isinstance(filenames, str):
        filenames = [filenames]
    return Dataset.text_line_dataset(list(filenames), compression_type or "")


def FixedLengthRecordDataset(filenames, record_bytes, header_bytes=0, footer_bytes=0, compression_type=""):
    """tf.data.FixedLengthRecordDataset."""
    if isinstance(filenames, str):
        filenames = [filenames]
    return Dataset.fixed_length_record_dataset(list(filenames), record_bytes, header_bytes, footer_bytes,
                                               compression_type)
