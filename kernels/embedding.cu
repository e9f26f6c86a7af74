// embedding.cu — token embedding lookup and its scatter-add gradient; learned
// positions (or BERT's row-0 token types) added to the hidden states.
// Shapes: ids (rows), table (vocab, dim), hidden (rows, dim); rows = b*s.
#include "kcommon.cuh"

// ---- kernels ------------------------------------------------------------------------------

__global__ void embed_fwd_kernel(void *out, int odt, const int64_t *ids, const void *w, int wdt, uint64_t rows,
                                 uint64_t dim, uint64_t vocab)
{
    GRID_STRIDE(e, rows * dim)
    {
        uint64_t r = e / dim, j = e % dim;
        int64_t id = ids[r];
        stf(out, odt, e, id >= 0 && (uint64_t)id < vocab ? ldf(w, wdt, (uint64_t)id * dim + j) : 0.0f);
    }
}

__global__ void embed_bwd_kernel(void *dw, int wdt, const int64_t *ids, const void *dy, int dt, uint64_t rows,
                                 uint64_t dim, uint64_t vocab)
{
    GRID_STRIDE(e, rows * dim)
    {
        uint64_t r = e / dim, j = e % dim;
        int64_t id = ids[r];
        if (id >= 0 && (uint64_t)id < vocab)
            atomic_accf(dw, wdt, (uint64_t)id * dim + j, ldf(dy, dt, e));
    }
}

__global__ void addpos_fwd_kernel(void *y, int ydt, const void *x, int xdt, const void *w, int wdt, uint64_t rows,
                                  uint64_t dim, uint64_t seq, int row0)
{
    GRID_STRIDE(e, rows * dim)
    {
        uint64_t r = e / dim, j = e % dim, t = row0 ? 0 : r % seq;
        stf(y, ydt, e, ldf(x, xdt, e) + ldf(w, wdt, t * dim + j));
    }
}

// One thread per table element (position t, column j) summing over the rows that use it.
__global__ void addpos_bwd_kernel(void *dw, int wdt, const void *dy, int dt, uint64_t rows, uint64_t dim,
                                  uint64_t seq, int row0)
{
    uint64_t trows = row0 ? 1 : seq, stride = row0 ? 1 : seq;
    GRID_STRIDE(e, trows * dim)
    {
        uint64_t t = e / dim, j = e % dim;
        float s = 0.0f;
        for (uint64_t r = t; r < rows; r += stride)
            s += ldf(dy, dt, r * dim + j);
        accf(dw, wdt, e, s);
    }
}

// ---- launchers ----------------------------------------------------------------------------

extern "C" int mp_k_embed_fwd(void *out, int odt, const int64_t *ids, const void *w, int wdt, uint64_t rows,
                              uint64_t dim, uint64_t vocab, cudaStream_t s)
{
    if (rows * dim)
        embed_fwd_kernel<<<grid_for(rows * dim, 256), 256, 0, s>>>(out, odt, ids, w, wdt, rows, dim, vocab);
    KCHECK();
}

extern "C" int mp_k_embed_bwd(void *dw, int wdt, const int64_t *ids, const void *dy, int dt, uint64_t rows,
                              uint64_t dim, uint64_t vocab, cudaStream_t s)
{
    if (dw && rows * dim)
        embed_bwd_kernel<<<grid_for(rows * dim, 256), 256, 0, s>>>(dw, wdt, ids, dy, dt, rows, dim, vocab);
    KCHECK();
}

extern "C" int mp_k_addpos_fwd(void *y, int ydt, const void *x, int xdt, const void *w, int wdt, uint64_t rows,
                               uint64_t dim, uint64_t seq, int row0, cudaStream_t s)
{
    if (rows * dim)
        addpos_fwd_kernel<<<grid_for(rows * dim, 256), 256, 0, s>>>(y, ydt, x, xdt, w, wdt, rows, dim,
                                                                      seq ? seq : 1, row0);
    KCHECK();
}

extern "C" int mp_k_addpos_bwd(void *dw, int wdt, const void *dy, int dt, uint64_t rows, uint64_t dim, uint64_t seq,
                               int row0, cudaStream_t s)
{
    uint64_t n = (row0 ? 1 : (seq ? seq : 1)) * dim;
    if (dw && n)
        addpos_bwd_kernel<<<grid_for(n, 256), 256, 0, s>>>(dw, wdt, dy, dt, rows, dim, seq ? seq : 1, row0);
    KCHECK();
}
