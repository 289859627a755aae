"""A stand-in for PyTorch's pluggable-allocator interface, for the host-backend tests of
gpupool's Python package: CUDAPluggableAllocator loads the named functions from the library
with the types PyTorch's C++ calls them with (size_t, int, cudaStream_t / void *, size_t,
int, cudaStream_t), and change_current_allocator refuses once something was allocated, as
PyTorch does. It is not PyTorch; the real one is tested on a GPU machine."""
import ctypes
import types

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)

initialized = False     # a test sets it to see the refusal to swap
current = None


class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path)
        self.path, self.names = path, (alloc_fn_name, free_fn_name)
        self.alloc = _ALLOC(ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value)
        self.free = _FREE(ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value)


def _change_current_allocator(allocator):
    global current
    if initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator


cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(
        CUDAPluggableAllocator=CUDAPluggableAllocator, change_current_allocator=_change_current_allocator
    )
)
