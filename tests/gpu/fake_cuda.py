"""Host-memory stand-ins for CUDA arrays, so the staging logic of the device allreduce runs on
CPU-only machines (the idea of mpi4py's own tests). A FakeCudaArray exposes
``__cuda_array_interface__`` over a numpy array; ``ftcomm.cuda._use_host_memory_for_tests()``
makes ftcomm accept it as device memory and copy with memcpy instead of cudaMemcpyAsync."""
from __future__ import annotations

import numpy as np


class FakeCudaArray:
    def __init__(self, array: np.ndarray, stream=None, readonly: bool = False):
        self.host = np.ascontiguousarray(array)
        self.stream = stream
        self.readonly = readonly

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.host.shape, "typestr": self.host.dtype.str,
                "data": (self.host.ctypes.data, self.readonly), "version": 3, "strides": None,
                "stream": self.stream}

    def numpy(self) -> np.ndarray:
        return self.host.copy()
