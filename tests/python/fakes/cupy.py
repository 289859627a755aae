"""A stand-in for CuPy's allocator interface, for the host-backend tests of gpupool's Python
package: CFunctionAllocator calls the C functions exactly as cupy/cuda/memory.pyx does
(malloc(param, size, device) for size > 0, free(param, ptr, device) when the memory dies
with a non-zero pointer), set_allocator keeps the function, get_current_stream gives the
legacy default stream (ptr 0). It is not CuPy; the real one is tested on a GPU machine."""
import ctypes
import types

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes).")


class _Memory:
    def __init__(self, size, param, malloc_func, free_func, device_id):
        self.size, self.device_id, self._param, self._free = size, device_id, param, _FREE(free_func)
        self.ptr = _MALLOC(malloc_func)(param, size, device_id) or 0 if size > 0 else 0

    def __del__(self):
        if self.ptr:
            self._free(self._param, self.ptr, self.device_id)


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset if mem.ptr else 0


class CFunctionAllocator:
    def __init__(self, param, malloc_func, free_func, owner):
        self._args = (param, malloc_func, free_func)
        self._owner = owner

    def malloc(self, size):
        param, malloc_func, free_func = self._args
        return MemoryPointer(_Memory(size, param, malloc_func, free_func, 0), 0)


_allocator = None


def _set_allocator(allocator=None):
    global _allocator
    _allocator = allocator


def _get_allocator():
    return _allocator


class Stream:
    """cupy.cuda.Stream as the allocator sees it: ptr (0: the legacy default stream)."""

    def __init__(self, ptr=0):
        self.ptr = ptr


_current_stream = Stream()


def _get_current_stream():
    return _current_stream


cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError, CFunctionAllocator=CFunctionAllocator),
    set_allocator=_set_allocator,
    get_allocator=_get_allocator,
    get_current_stream=_get_current_stream,
    Stream=Stream,
)


class _CaiArray:
    """What cupy.asarray makes of an object with __cuda_array_interface__: an array over its
    memory that keeps the object alive (UnownedMemory's owner)."""

    def __init__(self, obj):
        cai = obj.__cuda_array_interface__
        self._obj, (self.ptr, _), self.shape, self.typestr = obj, cai["data"], tuple(cai["shape"]), cai["typestr"]


def asarray(obj):
    if not hasattr(obj, "__cuda_array_interface__"):
        raise TypeError("the stand-in makes arrays of __cuda_array_interface__ only")
    return _CaiArray(obj)
