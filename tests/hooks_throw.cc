/*
 * hooks_throw.cc: a C++ caller of gpupool_torch_alloc(), as PyTorch's CUDAPluggableAllocator
 * is: with gpupool_torch_set_throw(1) a refusal arrives as std::runtime_error carrying
 * gpupool's reason, and the library is left usable. Run by check_hooks.c against a daemon
 * with an 8 MiB client limit ($GPUPOOL_SOCKET).
 */
#include <cstdio>
#include <stdexcept>

#include "gpupool.h"

int main() {
        int r = gpupool_torch_set_throw(1);

        if (r != 0) {
                std::printf("gpupool_torch_set_throw: %d\n", r);
                return 1;
        }
        try {
                void *p = gpupool_torch_alloc(12 << 20, 0, nullptr);

                std::printf("not thrown: %p\n", p);
                return 1;
        } catch (const std::runtime_error &e) {
                std::printf("caught: %s\n", e.what());
        }
        /* No lock is left held and the shared handle still works. */
        void *p = gpupool_torch_alloc(1 << 20, 0, nullptr);
        if (!p)
                return 1;
        gpupool_torch_free(p, 1 << 20, 0, nullptr);
        std::printf("after the throw: allocated and freed %p\n", p);
        /* Size 0 is not a refusal: nothing is thrown. */
        if (gpupool_torch_alloc(0, 0, nullptr) != nullptr)
                return 1;
        return 0;
}
