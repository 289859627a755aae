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
torch._C._cuda_beginAllocateToPool, _cuda_endAllocateToPool and _cuda_releasePool, which route
every later allocation on a device to a pool and stop, as PyTorch 2.8 and later do
($FAKE_TORCH_NO_MEMPOOL=1 plays an older PyTorch without them). A routed tensor's memory comes
from the pool's allocator (PyTorch's own allocator would carve it from segments it asked for),
and a NULL raises torch.cuda.OutOfMemoryError, as PyTorch's allocator does. What a pool's
tensors drop stays in the pool, for its next tensors of that size, as PyTorch's allocator keeps
it (c10/cuda/CUDACachingAllocator.cpp). A pool counts its uses (its MemPool, and each routing
begun and not released: PyTorch's use_count); torch.cuda.empty_cache() frees what is cached
only in pools nobody uses any more (release_cached_blocks() frees graph_pools_freeable, the
pools whose use_count is 0), and so does PyTorch's own retry after a NULL, which it skips while
a pool is routed on the device; dropping a MemPool releases it (~MemPool: releasePool, then
emptyCache of its id, which syncs the pool's events where nobody uses it any more: PyTorch
2.8 to 2.11 assert there that no pool is routed, and the process ends, as an H200 with PyTorch
2.11 showed). torch.cuda.memory_reserved() and memory_allocated() count every pool's."""
import ctypes
import os
import sys
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
        # As PyTorch 2.11's: an id and an allocator, no device (its pool's device is where it was made).
        self.id, self.allocator = (0, MemPool._ids), allocator


class _Pool:
    """PyTorch's PrivatePool: its uses, its segments (ptr: size) and what is cached free (size: [ptr])."""

    def __init__(self, allocator, device):
        self.allocator, self.device, self.use_count, self.segments, self.cached = allocator, device, 1, {}, {}

    def alloc(self, size):
        if self.cached.get(size):
            return self.cached[size].pop()
        ptr = self.allocator.alloc(size, self.device, None)
        if not ptr and not routed.get(self.device):
            _release_cached()          # PyTorch's retry after a NULL (none while a pool is routed)
            ptr = self.allocator.alloc(size, self.device, None)
        if ptr:
            self.segments[ptr] = size
        return ptr

    def release_cached(self):
        for size, ptrs in self.cached.items():
            for ptr in ptrs:
                self.allocator.free(ptr, size, self.device, None)
                del self.segments[ptr]
        self.cached = {}


_state = {}             # pool id: _Pool, while it has segments or uses
routed = {}             # device: the pools allocations on it go to, the first that was begun first


def _release_cached():
    for pool_id, pool in list(_state.items()):
        if pool.use_count == 0:
            pool.release_cached()
            if not pool.segments:
                del _state[pool_id]


def _pool_of(pool_id):
    if pool_id not in _state:
        raise RuntimeError(f"no pool {pool_id}")
    return _state[pool_id]


def _begin_allocate_to_pool(device, pool_id):
    pool = _pool_of(pool_id)
    if pool.device != device:
        raise RuntimeError(f"no pool {pool_id} on device {device}")
    pool.use_count += 1
    routed.setdefault(device, []).append((pool_id, pool))


def _end_allocate_to_pool(device, pool_id):
    routed[device] = [(i, p) for i, p in routed.get(device, []) if i != pool_id]
    if not routed[device]:
        del routed[device]


def _release_pool(device, pool_id):
    pool = _pool_of(pool_id)
    pool.use_count -= 1
    if pool.use_count < 0:
        raise RuntimeError(f"pool {pool_id} released more often than used")


class _MemPool(MemPool):
    def __init__(self, allocator=None):
        super().__init__(allocator)
        _state[self.id] = _Pool(allocator, _device)        # made on the current device

    def use_count(self):
        return _state[self.id].use_count

    def __del__(self):
        if sys.is_finalizing():         # not checked as the interpreter exits
            return
        pool = _state.get(self.id)
        # PyTorch 2.11's ~MemPool: releasePool(), which asserts that the pool exists and that its
        # use count stays at 0 or more, then emptyCache() of its id, which (where the pool is then
        # unused) syncs its events, asserting that no pool is routed on the device.
        if pool is None or pool.use_count < 1:
            _assert_failed("it != graph_pools.end()" if pool is None else "uc >= 0")
        pool.use_count -= 1
        if pool.use_count == 0:
            if routed.get(pool.device):
                _assert_failed("captures_underway.empty()")
            pool.release_cached()
            if not pool.segments:
                del _state[self.id]


def _assert_failed(what):
    """A TORCH_INTERNAL_ASSERT of PyTorch's allocator: the process ends (a C++ exception out of a destructor)."""
    sys.stderr.write("terminate called after throwing an instance of 'c10::Error'\n"
                     f"  what():  {what} INTERNAL ASSERT FAILED at \"c10/cuda/CUDACachingAllocator.cpp\" (the stand-in)\n")
    sys.stderr.flush()
    os._exit(134)


def _empty_cache():
    _release_cached()


def _memory_reserved(device=None):
    return sum(sum(p.segments.values()) for p in _state.values() if device in (None, p.device))


def _memory_allocated(device=None):
    return _memory_reserved(device) - sum(size * len(ptrs) for p in _state.values() if device in (None, p.device)
                                          for size, ptrs in p.cached.items())


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
        self._pool = routed[0][0][1] if 0 in routed else None
        self._allocator = self._pool.allocator if self._pool else current
        if self._allocator is None:
            raise RuntimeError("the stand-in has no native allocator: install a pluggable one first")
        initialized = True
        self._bytes = n * 4
        if self._pool:
            self._ptr = self._pool.alloc(self._bytes) if n else 0
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
        if self._ptr and self._pool:
            self._pool.cached.setdefault(self._bytes, []).append(self._ptr)     # PyTorch's cache keeps it
        elif self._ptr:
            self._allocator.free(self._ptr, self._bytes, 0, None)
        self._ptr = 0


def empty(n, dtype=float32, device="cuda"):
    if dtype != float32 or device != "cuda":
        raise ValueError("the stand-in makes float32 tensors on cuda only")
    return _Tensor(n)


class CUDAGraph:
    """torch.cuda.CUDAGraph's capture calls, which record that a capture is under way (and, as
    PyTorch's, end one that did not begin with an error)."""
    capturing = 0

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise RuntimeError(f"unknown capture_error_mode {capture_error_mode!r}")
        CUDAGraph.capturing += 1

    def capture_end(self):
        if not CUDAGraph.capturing:
            raise RuntimeError("no capture under way")
        CUDAGraph.capturing -= 1


cuda = types.SimpleNamespace(
    CUDAGraph=CUDAGraph,
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
    empty_cache=_empty_cache,
    memory_reserved=_memory_reserved,
    memory_allocated=_memory_allocated,
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
    _C._cuda_endAllocateToPool = _end_allocate_to_pool
    _C._cuda_releasePool = _release_pool
