#include "parallel/gpustat.h"
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/err.h"
#ifdef GLM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* The NVML ABI pieces used (nvml.h, stable since NVML 5): results are 0 on success. */
typedef int nvml_ret;
typedef struct nvml_dev_st *nvml_dev;
typedef struct { unsigned int gpu, memory; } nvml_util;
typedef struct { unsigned long long total, free, used; } nvml_mem;

struct glm_gpustat {
    void *lib;
    nvml_dev dev;
    nvml_ret (*shutdown)(void);
    nvml_ret (*util)(nvml_dev, nvml_util *);
    nvml_ret (*mem)(nvml_dev, nvml_mem *);
    nvml_ret (*power)(nvml_dev, unsigned int *); /* milliwatts */
};

glm_gpustat *glm_gpustat_open(int cuda_device) {
#ifdef GLM_HAVE_CUDA
    if (cuda_device < 0) return NULL;
    char bus[32];
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess) return NULL;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return NULL;
    nvml_ret (*init)(void) = (nvml_ret (*)(void))dlsym(lib, "nvmlInit_v2");
    nvml_ret (*by_bus)(const char *, nvml_dev *) = (nvml_ret (*)(const char *, nvml_dev *))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    glm_gpustat *g = glm_calloc(1, sizeof *g);
    g->lib = lib;
    g->shutdown = (nvml_ret (*)(void))dlsym(lib, "nvmlShutdown");
    g->util = (nvml_ret (*)(nvml_dev, nvml_util *))dlsym(lib, "nvmlDeviceGetUtilizationRates");
    g->mem = (nvml_ret (*)(nvml_dev, nvml_mem *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    g->power = (nvml_ret (*)(nvml_dev, unsigned int *))dlsym(lib, "nvmlDeviceGetPowerUsage");
    if (!init || !by_bus || !g->shutdown || !g->util || !g->mem || !g->power || init() != 0) {
        dlclose(lib);
        free(g);
        return NULL;
    }
    if (by_bus(bus, &g->dev) != 0) { g->shutdown(); dlclose(lib); free(g); return NULL; }
    return g;
#else
    return NULL;
#endif
}

void glm_gpustat_read(glm_gpustat *g, double *util, double *mem_used, double *power) {
    *util = *mem_used = *power = NAN;
    if (!g) return;
    nvml_util u;
    nvml_mem m;
    unsigned int mw;
    if (g->util(g->dev, &u) == 0) *util = u.gpu;
    if (g->mem(g->dev, &m) == 0) *mem_used = (double)m.used;
    if (g->power(g->dev, &mw) == 0) *power = mw / 1000.0;
}

void glm_gpustat_close(glm_gpustat *g) {
    if (!g) return;
    g->shutdown();
    dlclose(g->lib);
    free(g);
}

double glm_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return NAN;
    long size, rss;
    int ok = fscanf(f, "%ld %ld", &size, &rss) == 2;
    fclose(f);
    return ok ? (double)rss * (double)sysconf(_SC_PAGESIZE) : NAN;
}
