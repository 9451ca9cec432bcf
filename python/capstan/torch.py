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
components stay numpy arrays of bytes (torch has no strings). Importing
this module needs torch; the rest of capstan does not.
"""

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
