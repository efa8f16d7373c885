/* What the parallel layer needs from a run's settings: the launch (processes, nodes, the
 * rendezvous), the batch shape the memory plan sizes, and the layout of the model states (ZeRO,
 * pipeline stages, where the optimizer lives). train/ fills it from its flags
 * (glm_train_par_opts), `glmtrain info` from its own; the field names are the flags'. */
#ifndef GLM_PARALLEL_PAR_OPTS_H
#define GLM_PARALLEL_PAR_OPTS_H

typedef struct glm_par_opts {
    /* the job */
    const char *nproc_per_node, *master_addr, *device;
    int nnodes, node_rank, master_port, save_on_interrupt;
    double ddp_timeout;
    /* the batch */
    int per_device_train_batch_size, seq_len, gradient_accumulation_steps; /* seq_len: the longest example's tokens */
    int num_microbatches, gradient_checkpointing, fp16, fp32, seed;
    /* the layout */
    int zero_stage, pipeline_parallel_size, optimizer_in_backward;
    const char *device_map, *max_memory_per_gpu, *optim, *offload_optimizer;
} glm_par_opts;

#endif
