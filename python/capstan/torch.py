"""A torch.utils.data.IterableDataset over a Capstan pipeline or the data
service, so that a PyTorch loop reads from Capstan:

    import capstan.torch
    loader = torch.utils.data.DataLoader(
        capstan.torch.IterableDataset(capstan.data.service.from_dataset_id(dispatcher, dataset_id,
                                                                           job_name="train")),
        batch_size=None)   # the pipeline batches
    for features, labels in loader: ...

Each element comes as a tuple of torch tensors made with torch.from_numpy,
sharing the arrays' memory (no copy). Capstan's arrays are read-only (they
share the received buffers): treat the tensors as read-only too. Importing
this module needs torch; the rest of capstan does not.
"""

import warnings

import torch as _torch
import torch.utils.data as _torch_data


def _as_torch(array):
    with warnings.catch_warnings():
        # torch warns that the array is not writable: it is shared, on purpose.
        warnings.simplefilter("ignore", UserWarning)
        return _torch.from_numpy(array)


class IterableDataset(_torch_data.IterableDataset):
    """Iterates `dataset` (a capstan.data.Dataset), each element a tuple of
    torch tensors. With DataLoader worker processes, give each its own part
    (a data-service job shared by name, or shard()): every worker iterates
    the whole dataset otherwise, as with any IterableDataset."""

    def __init__(self, dataset):
        super().__init__()
        self._dataset = dataset

    def __iter__(self):
        for element in self._dataset:
            yield tuple(_as_torch(a) for a in element)
