/* GPU utilisation, memory and power of this process's GPU through NVML, loaded at run time
 * (dlopen libnvidia-ml.so.1, with the few declarations needed here: nvml.h is not installed
 * on every build machine). Without NVML or a GPU every figure is NAN. */
#ifndef GLM_PARALLEL_GPUSTAT_H
#define GLM_PARALLEL_GPUSTAT_H

typedef struct glm_gpustat glm_gpustat;

/* For CUDA device `cuda_device` (matched to NVML by PCI bus id); NULL when NVML or the device
 * is unavailable (a CPU run). */
glm_gpustat *glm_gpustat_open(int cuda_device);
/* util in %, memory used in bytes (every process on the GPU), power in W; NAN where unknown. */
void glm_gpustat_read(glm_gpustat *g, double *util, double *mem_used, double *power);
void glm_gpustat_close(glm_gpustat *g);
/* Resident memory of this process in bytes (for CPU ranks). */
double glm_rss_bytes(void);

#endif
