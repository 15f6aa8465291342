// A test double of the CUDA driver library (libcuda.so.1) for machines without a GPU.
//
// It exports the driver entry points Parallax probes, with their real C signatures, and
// nothing else. Launches return at once (as real launches do: they only enqueue work);
// the calls that block a host thread on the GPU sleep for the time the caller asked with
// fakecuda_set_wait_us() (per thread), so a test knows exactly how long each wait was.
// The agent's uprobes attach to these symbols by name, exactly as on the real library.
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUgraphExec;
typedef uint64_t CUdeviceptr;
typedef struct CUlaunchConfig_st CUlaunchConfig;

static __thread unsigned wait_us;
static volatile uint64_t launches;  // keeps the calls from being optimised away

void fakecuda_set_wait_us(unsigned us) { wait_us = us; }
uint64_t fakecuda_launches(void) { return launches; }

static void fake_wait(void) {
    if (!wait_us)
        return;  // (a benchmark times the call itself)
    struct timespec ts = {wait_us / 1000000, (long)(wait_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static __attribute__((noinline)) void count(int kind) { launches += kind; }

// noinline and a side effect each: every entry point keeps its own address, as in the
// real library (identical bodies could otherwise be folded into one symbol). Each calls
// out and is built with frame pointers, so it opens with a push, as a driver function's
// prologue does: the kernel emulates that instruction under a uprobe. (A leaf body opening
// with a RIP-relative load must be single-stepped out of line: several times the cost.)
#define FAKE_LAUNCH __attribute__((noinline, visibility("default")))

FAKE_LAUNCH CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream s, void **params, void **extra) {
    count(1);
    return 0;
}
FAKE_LAUNCH CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                         unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                         CUstream s, void **params, void **extra) {
    count(2);
    return 0;
}
FAKE_LAUNCH CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params,
                                      void **extra) {
    count(3);
    return 0;
}
FAKE_LAUNCH CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f,
                                           void **params, void **extra) {
    count(4);
    return 0;
}
FAKE_LAUNCH CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    count(5);
    return 0;
}
FAKE_LAUNCH CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    count(6);
    return 0;
}
FAKE_LAUNCH CUresult cuStreamSynchronize(CUstream s) {
    fake_wait();
    return 0;
}
FAKE_LAUNCH CUresult cuCtxSynchronize(void) {
    fake_wait();
    return 0;
}
FAKE_LAUNCH CUresult cuEventSynchronize(CUevent e) {
    fake_wait();
    return 0;
}
FAKE_LAUNCH CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    fake_wait();
    return 0;
}
