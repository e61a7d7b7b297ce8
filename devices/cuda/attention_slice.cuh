/* Where slice s of an attention's batch axes starts in operand 0 (o0: out or gy) and 1 (o1:
 * qkv): attention.cu and the tensor-core kernels (attention_tc.cuh). */
#ifndef MW__ATTENTION_SLICE_CUH
#define MW__ATTENTION_SLICE_CUH

struct mw__cuda_slice {
    int64_t o0, o1;
};

__device__ __forceinline__ mw__cuda_slice mw__cuda_slice_at(const mw__nd &w, int64_t s) {
    mw__cuda_slice r = {0, 0};
    for (int i = w.rank - 1; i >= 0; i--) {
        int64_t idx = s % w.dims[i];
        s /= w.dims[i];
        r.o0 += idx * w.stride[0][i];
        r.o1 += idx * w.stride[1][i];
    }
    return r;
}

#endif
