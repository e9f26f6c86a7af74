/* gpu.h — GPU profiles (configs/gpus/NAME.json): memory, usable fraction, dense
 * TFLOP/s per dtype, bandwidth, CUDA context and cuBLAS workspace sizes.
 * Profiles are looked up by name in $MEMPLAN_GPUS, ./configs/gpus, the
 * directory of the executable's configs/gpus, and PREFIX/share/memplan/gpus;
 * a NAME ending in .json is read as a file.
 */
#ifndef MEMPLAN_GPU_H
#define MEMPLAN_GPU_H

#include "ir/layers.h"

struct mp_gpu {
    char name[64];
    char description[128];
    uint64_t memory_bytes;
    double usable_fraction;
    double tflops_fp32, tflops_tf32, tflops_bf16, tflops_fp16;
    double bandwidth_gbs;
    uint64_t context_bytes;
    uint64_t workspace_bytes;
    int cc_major, cc_minor;
    unsigned sm_count;            /* streaming multiprocessors (0: unknown) */
    unsigned sm_threads;          /* resident threads per SM (maxThreadsPerMultiProcessor; 0: unknown):
                                     with sm_count they size torch's column sums' staging buffers */
    /* interconnect (GB/s per GPU, one direction) and data-parallel overheads */
    double nvlink_gbs;            /* GPU-GPU inside a node (0: peers talk over PCIe) */
    double pcie_gbs;              /* host <-> GPU (offload traffic) */
    double ib_gbs;                /* between nodes, per GPU (InfiniBand / RoCE NIC share) */
    uint64_t nccl_overhead_bytes; /* NCCL communicator buffers, outside the caching allocator: a
                                     measured figure (0: modelled from nccl_channels, search/nccl.h) */
    unsigned nccl_channels;       /* NCCL's collective channels on this GPU's usual node (0: unknown) */
};

/* Resident threads per SM of compute capability major.minor (the CUDA C++ Programming Guide's
 * table of technical specifications), 0 for one not in it. */
unsigned mp_cc_sm_threads(int major, int minor);

/* The CUDA context a PyTorch process holds on a GPU of compute capability major.minor (beyond the
 * caching allocator), from the table of published or measured figures (docs/memory-facts.md#cuda-context);
 * 0 for one without a row; *stack and *source (when not NULL) name the row's torch + CUDA and
 * where the figure comes from.  A profile without cuda_context_mib and the local device take it. */
uint64_t mp_cc_context_bytes(int major, int minor, const char **stack, const char **source);

/* Capacity available to the trainer: memory * usable_fraction. */
uint64_t mp_gpu_capacity(const struct mp_gpu *g);
/* Dense TFLOP/s for a precision policy's matmul dtype (0 = unsupported, e.g. bf16 on a T4). */
double mp_gpu_tflops(const struct mp_gpu *g, enum mp_precision p);

/* The local CUDA device as a target: its total memory, named "cuda:N", described by
 * the device's name.  MP_ERR_UNSUPPORTED without the cuda backend, MP_ERR_DEVICE when
 * device N does not answer (d says why); g is untouched then. */
enum mp_status mp_gpu_from_device(int device, struct mp_gpu *g, struct mp_diag *d);

enum mp_status mp_gpu_load(const char *name, const char *argv0, struct mp_gpu *g, struct mp_diag *d);

/* All profiles found, sorted by memory; caller frees *out. */
enum mp_status mp_gpu_list(const char *argv0, struct mp_gpu **out, size_t *n, struct mp_diag *d);

/* A profile for a plain --vram SIZE (no throughput figures, default overheads). */
void mp_gpu_from_vram(uint64_t bytes, struct mp_gpu *g);

#define MP_DEFAULT_GPU "a100-80gb"

#endif
