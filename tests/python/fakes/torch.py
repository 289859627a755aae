"""A stand-in for PyTorch's pluggable-allocator interface, for the host-backend tests of
gpupool's Python package: CUDAPluggableAllocator loads the named functions from the library
with the types PyTorch's C++ calls them with (size_t, int, cudaStream_t / void *, size_t,
int, cudaStream_t), and change_current_allocator refuses once something was allocated, as
PyTorch does. It is not PyTorch; the real one is tested on a GPU machine.

For bench/frameworks/torch_elastic.py it also has the little of a tensor that script uses:
torch.empty(n, dtype=float32, device="cuda") takes its memory from the current allocator
(host memory, on the host backend) and gives it back when the tensor dies. A refusal is the
RuntimeError PyTorch raises ("CUDA out of memory. ..."), made here from the hook's NULL. The
device's size is $FAKE_TORCH_TOTAL_MEMORY (default 1 GiB, the host backend's default).

For gpupool.use_with_torch(mode="mempool") it has torch.cuda.MemPool over a pluggable
allocator, made on the current device once torch.cuda.init() has run (a real PyTorch process
ends when a pool is routed before its CUDA state exists), and
torch._C._cuda_beginAllocateToPool, which routes
every later allocation on a device to a pool, as PyTorch 2.8 and later do
($FAKE_TORCH_NO_MEMPOOL=1 plays an older PyTorch without them). A routed tensor's memory comes
from the pool's allocator (PyTorch's own allocator would carve it from segments it asked for),
and a NULL raises torch.cuda.OutOfMemoryError, as PyTorch's allocator does."""
import ctypes
import os
import types

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)

__version__ = "2.11.0+standin"
initialized = False     # a test sets it to see the refusal to swap
current = None
_device = 0             # torch.cuda.current_device()


class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path)
        self.path, self.names = path, (alloc_fn_name, free_fn_name)
        self.alloc = _ALLOC(ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value)
        self.free = _FREE(ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value)

    def allocator(self):
        return self             # PyTorch's: the _cuda_CUDAAllocator that MemPool takes


class OutOfMemoryError(RuntimeError):
    pass


_cuda_initialized = False


def _cuda_init():
    global _cuda_initialized
    _cuda_initialized = True


class MemPool:
    _ids = 0

    def __init__(self, allocator=None):
        if not _cuda_initialized:   # PyTorch's caching allocator has no device state yet
            raise RuntimeError("the stand-in's CUDA is not initialized: a pool made before torch.cuda.init() "
                               "ends a real PyTorch process")
        MemPool._ids += 1
        self.id, self.allocator, self.device = (0, MemPool._ids), allocator, _device


routed = {}             # device: the MemPool every allocation on it goes to


def _begin_allocate_to_pool(device, pool_id):
    pools = [p for p in _pools if p.id == pool_id and p.device == device]
    if not pools:
        raise RuntimeError(f"no pool {pool_id} on device {device}")
    routed[device] = pools[0]


_pools = []


class _MemPool(MemPool):
    def __init__(self, allocator=None):
        super().__init__(allocator)
        _pools.append(self)


class _DeviceGuard:
    def __init__(self, device):
        self.device = device

    def __enter__(self):
        global _device
        self.before, _device = _device, self.device

    def __exit__(self, *exc):
        global _device
        _device = self.before


def _change_current_allocator(allocator):
    global current
    if initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator


float32 = "float32"


class _Tensor:
    def __init__(self, n):
        global initialized
        self._allocator = routed[0].allocator if 0 in routed else current
        if self._allocator is None:
            raise RuntimeError("the stand-in has no native allocator: install a pluggable one first")
        initialized = True
        self._bytes = n * 4
        if 0 in routed:
            self._ptr = self._allocator.alloc(self._bytes, 0, None) if n else 0
            if n and not self._ptr:
                raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {self._bytes} bytes")
            return
        # Python cannot catch the hook's C++ exception (it would abort): a NULL, then the error
        # PyTorch would raise from it.
        ctypes.CDLL(current.path).gpupool_torch_set_throw(0)
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
            self._allocator.free(self._ptr, self._bytes, 0, None)
            self._ptr = 0


def empty(n, dtype=float32, device="cuda"):
    if dtype != float32 or device != "cuda":
        raise ValueError("the stand-in makes float32 tensors on cuda only")
    return _Tensor(n)


cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(
        CUDAPluggableAllocator=CUDAPluggableAllocator, change_current_allocator=_change_current_allocator
    ),
    OutOfMemoryError=OutOfMemoryError,
    is_available=lambda: True,
    device_count=lambda: int(os.environ.get("FAKE_TORCH_DEVICES", 1)),
    init=_cuda_init,
    current_device=lambda: _device,
    device=_DeviceGuard,
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


_C = types.SimpleNamespace()
if not os.environ.get("FAKE_TORCH_NO_MEMPOOL"):
    cuda.memory.MemPool = _MemPool
    cuda.MemPool = _MemPool
    _C._cuda_beginAllocateToPool = _begin_allocate_to_pool
