"""A stand-in for PyTorch's pluggable-allocator interface, for the host-backend tests of
gpupool's Python package: CUDAPluggableAllocator loads the named functions from the library
with the types PyTorch's C++ calls them with (size_t, int, cudaStream_t / void *, size_t,
int, cudaStream_t), and change_current_allocator refuses once something was allocated, as
PyTorch does. It is not PyTorch; the real one is tested on a GPU machine.

For bench/frameworks/torch_elastic.py it also has the little of a tensor that script uses:
torch.empty(n, dtype=float32, device="cuda") takes its memory from the current allocator
(host memory, on the host backend) and gives it back when the tensor dies. A refusal is the
RuntimeError PyTorch raises ("CUDA out of memory. ..."), made here from the hook's NULL. The
device's size is $FAKE_TORCH_TOTAL_MEMORY (default 1 GiB, the host backend's default)."""
import ctypes
import os
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


float32 = "float32"


class _Tensor:
    def __init__(self, n):
        global initialized
        if current is None:
            raise RuntimeError("the stand-in has no native allocator: install a pluggable one first")
        initialized = True
        # Python cannot catch the hook's C++ exception (it would abort): a NULL, then the error
        # PyTorch would raise from it.
        ctypes.CDLL(current.path).gpupool_torch_set_throw(0)
        self._bytes = n * 4
        self._ptr = current.alloc(self._bytes, 0, None) if n else 0
        if n and not self._ptr:
            import gpupool              # what the hook's C++ exception says, under PyTorch

            raise RuntimeError("CUDA out of memory. gpupool refused " + gpupool.last_error()[1])

    def numel(self):
        return self._bytes // 4

    def fill_(self, value):
        ctypes.memset(self._ptr, int(value) & 0xFF, self._bytes)
        return self

    def __getitem__(self, i):
        if i != -1 or not self._bytes:
            raise IndexError("the stand-in reads the last element only")
        return float(ctypes.c_ubyte.from_address(self._ptr + self._bytes - 1).value)

    def __del__(self):
        if self._ptr:
            current.free(self._ptr, self._bytes, 0, None)
            self._ptr = 0


def empty(n, dtype=float32, device="cuda"):
    if dtype != float32 or device != "cuda":
        raise ValueError("the stand-in makes float32 tensors on cuda only")
    return _Tensor(n)


cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(
        CUDAPluggableAllocator=CUDAPluggableAllocator, change_current_allocator=_change_current_allocator
    ),
    is_available=lambda: True,
    get_device_properties=lambda device: types.SimpleNamespace(
        total_memory=int(os.environ.get("FAKE_TORCH_TOTAL_MEMORY", 1 << 30))),
    synchronize=lambda: None,
)


class _CaiTensor:
    """What torch.as_tensor makes of an object with __cuda_array_interface__: a tensor over its
    memory that keeps the object alive, refusing the read-only flag as PyTorch does."""

    def __init__(self, obj):
        cai = obj.__cuda_array_interface__
        ptr, read_only = cai["data"]
        if read_only:
            raise TypeError("the read only flag is not supported, should always be False")
        self._obj, self._ptr, self.shape, self.typestr = obj, ptr, tuple(cai["shape"]), cai["typestr"]

    def data_ptr(self):
        return self._ptr


def as_tensor(obj):
    if not hasattr(obj, "__cuda_array_interface__"):
        raise TypeError("the stand-in makes tensors of __cuda_array_interface__ only")
    return _CaiTensor(obj)
