/* The warp-level tensor-core primitives of the bf16 flash-attention kernels (attention_fa.cu,
 * seqattn_tc.cu): mma.sync m16n8k16 (bf16 in, fp32 accumulators), ldmatrix, movmatrix, cp.async,
 * and the few conversions and shuffles around them. The only inline PTX of src/ops.
 *
 * The kernels that use them are plain C between these primitives and their launchers, so the
 * tests can include a kernel file with its emulation switch defined (FA_EMU, CTR_TC_EMU), supply
 * host versions of these functions under the same names (a warp emulator) and run the kernels
 * on a CPU; such a file includes this header only when not emulated. */
#ifndef NB_MMA_CUH
#define NB_MMA_CUH

static __device__ __forceinline__ unsigned nb_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; ok == 0 writes 16 zero bytes and reads nothing. */
static __device__ __forceinline__ void nb_cp_async16(void *dst, const void *src, int ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(nb_smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0)
                 : "memory");
}
static __device__ __forceinline__ void nb_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most one committed group (the newest) is still in flight. */
static __device__ __forceinline__ void nb_cp_async_wait1(void) {
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

/* Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8. Volatile with a
 * memory clobber: it reads shared memory that __syncthreads-separated stores change. */
static __device__ __forceinline__ void nb_ldmatrix_x4(unsigned r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(nb_smem_addr(p))
                 : "memory");
}
static __device__ __forceinline__ void nb_ldmatrix_x4_trans(unsigned r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(nb_smem_addr(p))
                 : "memory");
}

/* c[16x8] += a[16x16] . b[16x8], fp32 accumulators. */
static __device__ __forceinline__ void nb_mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* The warp's 8x8 bf16 matrix (lane l: row l/4, columns 2(l%4), +1), transposed, in that layout. */
static __device__ __forceinline__ unsigned nb_movmatrix_trans(unsigned x) {
    unsigned r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

/* Two floats -> bf16x2 (lo in the low half), round to nearest even like nb_st. */
static __device__ __forceinline__ unsigned nb_pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* 2^x; 2^-inf = 0. */
static __device__ __forceinline__ float nb_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ float nb_shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

#endif
