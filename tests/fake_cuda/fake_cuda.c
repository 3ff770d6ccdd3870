/* A fake CUDA driver for tests (tests/cuda_driver.rs): the subset of the driver API
 * that src/device/cuda.rs calls, on CPU, so that the production CUDA engine runs in
 * CI on machines without a GPU. Device memory (cuMemAlloc) is fenced: a memfd mapped
 * twice, PROT_NONE at the addresses handed out and read-write at an alias only this
 * file knows, so a host dereference of a device pointer crashes the test. A copy
 * across two allocations is refused (CUDA_ERROR_INVALID_VALUE), as CUDA does. A copy
 * whose memory types disagree with the addresses it names (a device pointer passed as
 * host memory or the reverse) fails with CUDA_ERROR_INVALID_VALUE. Every call is
 * counted (fake_cuda_calls). Not a CUDA implementation: no kernels, no concurrency
 * semantics; copies run at submission. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_DEVICE = 101 };

static const uint64_t CAPACITY = 256u << 20;
static char *fenced, *alias;
static uint64_t next_free;
static uint64_t calls;

uint64_t fake_cuda_calls(void) { return calls; }

/* Allocations made (device addresses): a copy must stay inside one, as CUDA requires. */
#define MAX_ALLOCS 65536
static struct { uint64_t start, len; } allocs[MAX_ALLOCS];
static int nallocs;

static int in_device(uint64_t a, uint64_t n) {
    for (int i = 0; i < nallocs; i++) {
        if (a >= allocs[i].start && a + n <= allocs[i].start + allocs[i].len) return 1;
    }
    return 0;
}
static int touches_device(uint64_t a, uint64_t n) {
    return fenced && a < (uint64_t)fenced + CAPACITY && a + n > (uint64_t)fenced;
}
static char *dev(uint64_t a) { return alias + (a - (uint64_t)fenced); }

CUresult cuInit(unsigned flags) {
    (void)flags;
    calls++;
    if (fenced) return OK;
    int fd = memfd_create("fake-cuda", 0);
    if (fd < 0 || ftruncate(fd, (off_t)CAPACITY) != 0) return OUT_OF_MEMORY;
    fenced = mmap(NULL, CAPACITY, PROT_NONE, MAP_SHARED, fd, 0);
    alias = mmap(NULL, CAPACITY, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return fenced == MAP_FAILED || alias == MAP_FAILED ? OUT_OF_MEMORY : OK;
}
CUresult cuDeviceGet(int *d, int ordinal) {
    calls++;
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) {
    calls++;
    if (d != 0) return INVALID_DEVICE;
    *ctx = (void *)0x100;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(int d) { calls++; return d == 0 ? OK : INVALID_DEVICE; }
CUresult cuCtxPushCurrent_v2(void *ctx) { calls++; return ctx == (void *)0x100 ? OK : INVALID_VALUE; }
CUresult cuCtxPopCurrent_v2(void **ctx) { calls++; if (ctx) *ctx = (void *)0x100; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { calls++; return ctx == (void *)0x100 || ctx == NULL ? OK : INVALID_VALUE; }
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; calls++; *s = (void *)0x200; return OK; }
CUresult cuStreamDestroy_v2(void *s) { (void)s; calls++; return OK; }
CUresult cuStreamSynchronize(void *s) { (void)s; calls++; return OK; }
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; calls++; *e = malloc(1); return *e ? OK : OUT_OF_MEMORY; }
CUresult cuEventRecord(void *e, void *s) { (void)s; calls++; return e ? OK : INVALID_VALUE; }
CUresult cuEventSynchronize(void *e) { calls++; return e ? OK : INVALID_VALUE; }
CUresult cuEventDestroy_v2(void *e) { calls++; free(e); return OK; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    (void)flags;
    calls++;
    *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    return *p ? OK : OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) { calls++; free(p); return OK; }
CUresult cuMemAlloc_v2(uint64_t *p, size_t n) {
    calls++;
    uint64_t start = (next_free + 255) / 256 * 256;
    if (!fenced || start + n > CAPACITY || nallocs == MAX_ALLOCS) return OUT_OF_MEMORY;
    next_free = start + n;
    *p = (uint64_t)fenced + start;
    allocs[nallocs].start = *p;
    allocs[nallocs].len = n ? n : 1;
    nallocs++;
    return OK;
}
CUresult cuMemFree_v2(uint64_t p) { calls++; return in_device(p, 1) ? OK : INVALID_VALUE; }

/* cuMemcpyAsync: unified addressing, either side host or device. */
CUresult cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *s) {
    (void)s;
    calls++;
    if ((touches_device(dst, n) && !in_device(dst, n)) || (touches_device(src, n) && !in_device(src, n))) return INVALID_VALUE;
    memmove(in_device(dst, n) ? dev(dst) : (char *)dst, in_device(src, n) ? dev(src) : (const char *)src, n);
    return OK;
}

typedef struct {
    size_t srcXInBytes, srcY;
    unsigned srcMemoryType;
    const void *srcHost;
    uint64_t srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    unsigned dstMemoryType;
    void *dstHost;
    uint64_t dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

/* The side's address of row 0 or NULL when its type disagrees with the address. */
static char *side(unsigned type, uint64_t host, uint64_t device, size_t pitch, size_t width, size_t height) {
    uint64_t span = height ? (height - 1) * pitch + width : 0;
    if (type == 1) return touches_device(host, span) ? NULL : (char *)host;
    if (type == 2) return in_device(device, span) ? dev(device) : NULL;
    return NULL;
}

CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *p, void *s) {
    (void)s;
    calls++;
    if (p->srcXInBytes || p->srcY || p->dstXInBytes || p->dstY || p->srcArray || p->dstArray) return INVALID_VALUE;
    if (p->Height > 1 && (p->srcPitch < p->WidthInBytes || p->dstPitch < p->WidthInBytes)) return INVALID_VALUE;
    char *src = side(p->srcMemoryType, (uint64_t)p->srcHost, p->srcDevice, p->srcPitch, p->WidthInBytes, p->Height);
    char *dst = side(p->dstMemoryType, (uint64_t)p->dstHost, p->dstDevice, p->dstPitch, p->WidthInBytes, p->Height);
    if (!src || !dst) return INVALID_VALUE;
    for (size_t r = 0; r < p->Height; r++) memmove(dst + r * p->dstPitch, src + r * p->srcPitch, p->WidthInBytes);
    return OK;
}

CUresult cuGetErrorString(CUresult rc, const char **s) {
    switch (rc) {
    case OK: *s = "no error"; return OK;
    case INVALID_VALUE: *s = "invalid argument"; return OK;
    case OUT_OF_MEMORY: *s = "out of memory"; return OK;
    case INVALID_DEVICE: *s = "invalid device ordinal"; return OK;
    default: *s = NULL; return INVALID_VALUE;
    }
}
