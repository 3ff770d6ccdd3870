/* cuda_driver.h: device memory for the tests that run on a GPU, from CUDA's driver API
 * opened at run time (libcuda.so.1), as the library's CUDA engine does: nothing CUDA is
 * needed to build the tests, and on a machine without a driver cuda_driver_open() says
 * so and the CUDA checks are skipped (ctest also runs them through a fake driver on
 * fenced memory: MWS_CUDA_DRIVER). Allocations are made in the primary context of
 * device 0 (the one mws_device_engine_new_cuda copies in). Test code only; compiles
 * as C11 and C++17; not thread-safe (call it from the test's thread). */
#ifndef MWS_TESTS_CUDA_DRIVER_H
#define MWS_TESTS_CUDA_DRIVER_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_driver {
    int opened; /* 1: usable; -1: no driver (or no device) */
    void *ctx;
    int (*mem_alloc)(uint64_t *address, size_t len);
    int (*mem_free)(uint64_t address);
    int (*ctx_set_current)(void *ctx);
} cuda_driver;

static inline cuda_driver *cuda_driver_state(void) {
    static cuda_driver d;
    return &d;
}

/* 1 when device 0 of a CUDA driver can be used; 0 otherwise (then nothing else works). */
static inline int cuda_driver_open(void) {
    cuda_driver *d = cuda_driver_state();
    void *lib, *sym;
    int (*init)(unsigned);
    int (*device_get)(int *, int);
    int (*retain)(void **, int);
    int device = 0;
    if (d->opened != 0) {
        return d->opened == 1;
    }
    d->opened = -1;
    /* The library's CUDA engine opens the same file (MWS_CUDA_DRIVER: ctest's fake
     * driver, tests/fake_cuda/fake_cuda.c). */
    {
        const char *path = getenv("MWS_CUDA_DRIVER");
        lib = dlopen(path != NULL && path[0] != '\0' ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == NULL) {
        return 0;
    }
#define MWS_CUDA_SYM(name, field)        \
    sym = dlsym(lib, name);              \
    if (sym == NULL) {                   \
        return 0;                        \
    }                                    \
    memcpy(&(field), &sym, sizeof(sym));
    MWS_CUDA_SYM("cuInit", init)
    MWS_CUDA_SYM("cuDeviceGet", device_get)
    MWS_CUDA_SYM("cuDevicePrimaryCtxRetain", retain)
    MWS_CUDA_SYM("cuMemAlloc_v2", d->mem_alloc)
    MWS_CUDA_SYM("cuMemFree_v2", d->mem_free)
    MWS_CUDA_SYM("cuCtxSetCurrent", d->ctx_set_current)
#undef MWS_CUDA_SYM
    if (init(0) != 0 || device_get(&device, 0) != 0 || retain(&d->ctx, device) != 0 ||
        d->ctx_set_current(d->ctx) != 0) {
        return 0;
    }
    d->opened = 1;
    return 1;
}

/* `len` bytes of memory of device 0: its address, or 0 on failure. */
static inline uint64_t cuda_alloc(size_t len) {
    cuda_driver *d = cuda_driver_state();
    uint64_t address = 0;
    if (!cuda_driver_open() || d->ctx_set_current(d->ctx) != 0 || d->mem_alloc(&address, len) != 0) {
        return 0;
    }
    return address;
}

static inline void cuda_free(uint64_t address) {
    cuda_driver *d = cuda_driver_state();
    if (address != 0 && cuda_driver_open() && d->ctx_set_current(d->ctx) == 0) {
        (void)d->mem_free(address);
    }
}

#endif /* MWS_TESTS_CUDA_DRIVER_H */
