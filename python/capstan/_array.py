"""capstan.Array: the arrays Capstan gives out (fetched values, dataset
elements, collective results). A numpy array in every way, read-only over
the buffer Capstan received (no copy), that also speaks DLPack:
torch.from_dlpack(a), jax.dlpack.from_dlpack(a) and numpy.from_dlpack(a)
take it with no copy (numpy's own __dlpack__ refuses read-only arrays).
What numpy computes from one (a + 1, a.sum()) is a plain numpy array or
scalar, as from any array; a view (a[1:], a.reshape(...)) stays an Array
over the same buffer. Treat memory shared through DLPack as read-only too:
DLPack cannot say so, and a consumer that writes changes what every holder
of the buffer sees.
"""

import numpy as _np

from . import _capstan

_CPU = 1  # DLPack's kDLCPU


class Array(_np.ndarray):
    """A read-only numpy array over a Capstan buffer, exported by DLPack."""

    def __dlpack__(self, stream=None):
        if stream is not None:
            raise BufferError(f"a Capstan array is in host memory: __dlpack__ takes stream=None, not {stream!r}")
        return _capstan._to_dlpack(self)

    def __dlpack_device__(self):
        return (_CPU, 0)

    def __array_wrap__(self, obj, context=None):
        # Computed results are new arrays: plain numpy, as from any array.
        out = _np.ndarray.__array_wrap__(self, obj, context).view(_np.ndarray)
        return out[()] if out.ndim == 0 else out
