/* A process that holds the container's first GPU, for host.audit on the GPU host: NVML lists it among the GPU's
 * compute processes for as long as it runs. Built by `python -m e2e.gpu_node_run prepare` (cc) and put in the pod
 * image beside nvidia-smi. libcuda comes from the driver, injected into the container by NVIDIA's runtime, so it is
 * opened at run time and the program needs no CUDA headers: the declarations below are the driver API's (cuda.h).
 * It stays up even when CUDA fails (no GPU in the container, or a rehearsal without one), saying why, so the pod
 * runs either way and the run records what the container could do. */
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

typedef int (*cu_init)(unsigned int flags);
typedef int (*cu_device_get)(int *device, int ordinal);
typedef int (*cu_primary_ctx_retain)(void **context, int device);
typedef int (*cu_ctx_set_current)(void *context);
typedef int (*cu_mem_alloc)(unsigned long long *pointer, size_t bytes);

static int hold(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda == NULL) {
        printf("hold-error %s\n", dlerror());
        return 1;
    }
    cu_init init = (cu_init)dlsym(cuda, "cuInit");
    cu_device_get device_get = (cu_device_get)dlsym(cuda, "cuDeviceGet");
    cu_primary_ctx_retain retain = (cu_primary_ctx_retain)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_current set_current = (cu_ctx_set_current)dlsym(cuda, "cuCtxSetCurrent");
    cu_mem_alloc mem_alloc = (cu_mem_alloc)dlsym(cuda, "cuMemAlloc_v2");
    if (!init || !device_get || !retain || !set_current || !mem_alloc) {
        printf("hold-error a driver API symbol is missing\n");
        return 1;
    }
    int device = 0, rc;
    void *context = NULL;
    unsigned long long memory = 0;
    if ((rc = init(0)) != 0 || (rc = device_get(&device, 0)) != 0 || (rc = retain(&context, device)) != 0 ||
        (rc = set_current(context)) != 0 || (rc = mem_alloc(&memory, 1 << 20)) != 0) {
        printf("hold-error CUresult %d\n", rc);
        return 1;
    }
    printf("holding\n");
    return 0;
}

int main(void) {
    hold();
    fflush(stdout);
    pause();
    return 0;
}
