/* cn.Wasm()'s kernels: the shared loops that kernels.py instantiates per op, and the kernels
 * that are not elementwise. Compiled by build.py (clang --target=wasm32-wasi -msimd128 -O2).
 *
 * Conventions (backend.py relies on them):
 * - Pointers are byte addresses in this module's linear memory; sizes are element counts.
 * - Float scalars arrive as their 32-bit patterns (int), so every host passes plain integers.
 * - An N-d strided loop reads a descriptor d = [nd, shape[nd], strides of operand 0 (the
 *   output)[nd], strides of operand 1[nd], ...], strides in elements, 0 where an operand
 *   broadcasts. The last dim is the row: contiguous rows are plain loops that clang turns into
 *   SIMD128 code; the host merges dims beforehand so rows are as long as the layout allows.
 * - No kernel allocates: the host (backend.py) owns the heap above heap_base().
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
typedef unsigned char u8;

/* The tab's module; the desktop's native build puts native.h in front instead of this block
 * (the same names: EXPORT, AT, the SIMD128 intrinsics, the memory; its engine owns the arena) */
#ifdef __wasm__
#include <wasm_simd128.h>

/* noinline: run_commands calls every kernel; inlining them all there would double the module */
#define EXPORT(name) __attribute__((export_name(#name), noinline))
/* a byte address of linear memory (a command word) as a pointer */
#define AT(addr) ((void *)(uintptr_t)(addr))

extern unsigned char __heap_base;
EXPORT(heap_base) int heap_base(void) { return (int)(uintptr_t)&__heap_base; }
EXPORT(memory_grow) int memory_grow(int pages) { return __builtin_wasm_memory_grow(0, pages); }
/* (grow(0) would also detach the host's views of the memory) */
EXPORT(memory_pages) int memory_pages(void) { return __builtin_wasm_memory_size(0); }
#endif

/* -- threads: parallel_for ------------------------------------------------------------------
 * parallel_for(fn, args, n, work) runs fn(args, begin, end) over the items [0, n). The threaded
 * build (build.py: -matomics, memory imported and shared with the pool's workers, POOL_THREADS
 * defined) hands the items one at a time, from an atomic counter, to the calling thread and to
 * the workers parked in pool_worker that join in time, when `work` (multiply-adds, say) pays for
 * waking them; every other build, and small work, runs fn(args, 0, n) in one call. An item is
 * computed whole by one thread, by the same code as in one call (each output element by one
 * thread, with the same summation order), so both builds give the same bits. Only the host's
 * thread calls parallel_for, never a task (a worker waiting on itself would never return). */
typedef void (*task_fn)(const void *args, int begin, int end);
#ifdef POOL_THREADS
#define POOL_STACK 65536   /* each worker's stack (the caller's: -z stack-size) */
/* below this much work one thread does it all: waking the workers costs microseconds (on a
 * busy machine far more), a product of 2^17 multiply-adds about 30 us on one core */
#define PARALLEL_MIN_WORK (1 << 17)
/* pool.state: the job's tag (its generation, 23 bits) << 8 | POOL_OPEN while workers may join |
 * the number of workers inside it. A worker joins only an open job of its generation, with one
 * compare-and-swap, and only joined workers read the job; the caller closes the job once the
 * items are all taken and waits for those inside. So a worker the machine is slow to wake never
 * holds the caller up: it finds the job closed (or a later one) and parks again. */
#define POOL_OPEN 128u
#define POOL_TAG(g) (((unsigned)(g) & 0x7FFFFFu) << 8)
static struct {
    int generation;        /* bumped once per job: the workers wait on it */
    unsigned state;
    int next;              /* the next item to take */
    int items;
    task_fn fn;
    const void *args;
    int joins;             /* times a worker joined a job (a test's evidence of sharing) */
} pool;
static int pool_workers;  /* parked in pool_worker */
static int pool_caller_waits;  /* the host's thread may block (a worker, Node): pool_set_caller_waits */
#define POOL_SPINS 4096   /* loads the caller spins before it blocks (the last items end soon) */
static _Alignas(16) u8 pool_stacks[POOL_THREADS - 1][POOL_STACK];

static void pool_take(void) {
    int i;
    while ((i = __atomic_fetch_add(&pool.next, 1, __ATOMIC_SEQ_CST)) < pool.items) pool.fn(pool.args, i, i + 1);
}

/* where worker w (1 .. POOL_THREADS - 1) sets its __stack_pointer before calling pool_worker
 * (a leaf: it runs on no stack) */
EXPORT(pool_stack_top) int pool_stack_top(int w) {
    if (w < 1 || w >= POOL_THREADS) __builtin_trap();
    return (int)(uintptr_t)(pool_stacks[w - 1] + POOL_STACK);
}

/* the threads that may share a job: the caller and the workers parked so far */
EXPORT(pool_threads) int pool_threads(void) { return 1 + __atomic_load_n(&pool_workers, __ATOMIC_SEQ_CST); }

/* whether the calling thread may block in memory.atomic.wait: not on a page's main thread
 * (Pyodide with ?worker=0), where it traps; there the caller spins until the workers are done */
EXPORT(pool_set_caller_waits) void pool_set_caller_waits(int may) { pool_caller_waits = may; }

/* the jobs shared so far and the workers' joins (a test's evidence that the threads took part) */
EXPORT(pool_jobs) int pool_jobs(void) { return __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST); }
EXPORT(pool_joins) int pool_joins(void) { return __atomic_load_n(&pool.joins, __ATOMIC_SEQ_CST); }

/* a worker's whole life: wait for a job, join it if it is still open, take items, leave */
EXPORT(pool_worker) void pool_worker(void) {
    __atomic_fetch_add(&pool_workers, 1, __ATOMIC_SEQ_CST);
    int seen = __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST);
    for (;;) {
        __builtin_wasm_memory_atomic_wait32(&pool.generation, seen, -1);  /* (at once if changed) */
        int now = __atomic_load_n(&pool.generation, __ATOMIC_SEQ_CST);
        if (now == seen) continue;
        seen = now;
        unsigned state = __atomic_load_n(&pool.state, __ATOMIC_SEQ_CST);
        while ((state & ~127u) == (POOL_TAG(seen) | POOL_OPEN)) {
            if (__atomic_compare_exchange_n(&pool.state, &state, state + 1, 0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST)) {
                __atomic_fetch_add(&pool.joins, 1, __ATOMIC_SEQ_CST);
                pool_take();
                if (__atomic_sub_fetch(&pool.state, 1u, __ATOMIC_SEQ_CST) == POOL_TAG(seen))
                    __builtin_wasm_memory_atomic_notify((int *)&pool.state, 1);  /* the last out */
                break;
            }
        }
    }
}

/* The caller waits for the workers inside the job (busy with their last item) by spinning a
 * little, then, where it may, blocking: a worker the machine took off its core gets that core
 * instead of a spinning caller. */
static void parallel_for(task_fn fn, const void *args, int n, double work) {
    int workers = __atomic_load_n(&pool_workers, __ATOMIC_SEQ_CST);
    if (workers == 0 || n < 2 || work < PARALLEL_MIN_WORK) { fn(args, 0, n); return; }
    pool.fn = fn;
    pool.args = args;
    pool.items = n;
    __atomic_store_n(&pool.next, 0, __ATOMIC_SEQ_CST);
    int job = pool.generation + 1;
    __atomic_store_n(&pool.state, POOL_TAG(job) | POOL_OPEN, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool.generation, job, __ATOMIC_SEQ_CST);
    __builtin_wasm_memory_atomic_notify(&pool.generation, (unsigned)workers);
    pool_take();
    __atomic_fetch_and(&pool.state, ~POOL_OPEN, __ATOMIC_SEQ_CST);   /* no one joins any more */
    unsigned state;
    for (int spins = 0; (state = __atomic_load_n(&pool.state, __ATOMIC_SEQ_CST)) & 127u; spins++)
        if (pool_caller_waits && spins >= POOL_SPINS)   /* (returns at once if state changed) */
            __builtin_wasm_memory_atomic_wait32((int *)&pool.state, (int)state, -1);
}
#else
static inline void parallel_for(task_fn fn, const void *args, int n, double work) {
    (void)work;
    fn(args, 0, n);
}
#endif

static inline float bits_f32(int bits) { union { int i; float f; } u = { bits }; return u.f; }

/* -- scalar helpers named in kernels.py's tables (NumPy's semantics, see core/backend.py) -- */
#ifdef __wasm__  /* (native.h: the same semantics in C) */
static inline float max_f32(float a, float b) { return __builtin_wasm_max_f32(a, b); }
static inline float min_f32(float a, float b) { return __builtin_wasm_min_f32(a, b); }
#endif

static inline float mod_f32(float a, float b) {
    if (b == 0) return fmodf(a, b);  /* NaN */
    float m = fmodf(a, b);
    if (m != 0) { if ((b < 0) != (m < 0)) m += b; }
    else m = copysignf(0.0f, b);
    return m;
}

static inline float floordiv_f32(float a, float b) {
    if (b == 0) return a / b;
    float m = fmodf(a, b), div = (a - m) / b;
    if (m != 0 && (b < 0) != (m < 0)) div -= 1.0f;
    if (div == 0) return copysignf(0.0f, a / b);
    float f = floorf(div);
    return div - f > 0.5f ? f + 1.0f : f;
}

static inline int floordiv_i32(int a, int b) {
    if (b == 0) return 0;
    if (b == -1) return (int)(0u - (unsigned)a);  /* INT_MIN // -1 wraps, as in NumPy */
    int q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static inline int mod_i32(int a, int b) {
    if (b == 0 || b == -1) return 0;
    int r = a % b;
    return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

static inline int trunc_f32_i32(float x) {  /* saturating: NaN -> 0, never a trap */
    if (x != x) return 0;
    if (x >= 2147483648.0f) return INT_MAX;
    if (x <= -2147483648.0f) return INT_MIN;
    return (int)x;
}

/* float16 (its bit patterns) <-> float32, as NumPy converts: round to nearest even, overflow
 * to infinity, NaN stays NaN (quiet) */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, m = h & 0x3ff;
    union { uint32_t i; float f; } u;
    if (e == 0) return sign ? -(float)m * 5.9604645e-8f : (float)m * 5.9604645e-8f; /* m * 2^-24 */
    u.i = sign | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
    return u.f;
}

static inline uint16_t f32_to_f16(float f) {
    union { float f; uint32_t i; } u = { f };
    uint32_t sign = (u.i >> 16) & 0x8000, a = u.i & 0x7fffffff;
    if (a >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000 ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000) return (uint16_t)(sign | 0x7c00);    /* >= 65520: rounds past 65504 */
    if (a < 0x38800000) {   /* below 2^-14: a subnormal, rounded by a float add at 2^-24 */
        u.i = a;
        u.f += 0.5f;
        return (uint16_t)(sign | (u.i - 0x3f000000));
    }
    a += 0xc8000fffu + ((a >> 13) & 1);   /* rebias the exponent, round half to even */
    return (uint16_t)(sign | (a >> 13));
}

/* e^x without libm, so that loops over it vectorise: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two
 * parts), e^r by Cephes' expf polynomial, 2^n in two factors (n = 128 and the subnormals
 * included). Within 1 ulp of the float64 exp rounded (normal results; checked on every third
 * float32); overflows to inf, underflows to 0, NaN stays NaN. */
static inline float exp_f32(float x) {
    float c = x > 88.8f ? 88.8f : x;   /* (NaN fails both tests: it goes through as NaN) */
    c = c < -104.0f ? -104.0f : c;
    float n = __builtin_rintf(c * 1.44269504088896341f);
    float r = c - n * 0.693359375f + n * 2.12194440e-4f, z = r * r;
    float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
                4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    int k = (int)n, k1 = k / 2;
    union { int i; float f; } s1 = { (k1 + 127) << 23 }, s2 = { (k - k1 + 127) << 23 };
    return (p * z + r + 1.0f) * s1.f * s2.f;
}

/* erf without libm (erff is a call per element; this vectorises): |x| < 1.25: x + x P(x^2);
 * else 1 - erfc(|x|) with the sign of x, erfc(a) = exp(Q(a - 2.5) - a^2) (|a| clamped at 4,
 * where erf is 1 in float32). P and Q: Chebyshev fits (in float64) of erf(x) / x - 1 over
 * x^2 in [0, 1.5625] and of log(erfc(a)) + a^2 over [1.25, 4]. Within 2 ulp of the float64
 * erf rounded, with fused multiply-adds or without (checked over every float32); NaN stays
 * NaN, -0 stays -0. */
static inline float erf_f32(float x) {
    float t = x * x;
    float p = ((((((-7.629189307e-06f * t + 1.042495074e-04f) * t - 8.346330323e-04f) * t +
                  5.209747540e-03f) * t - 2.686065500e-02f) * t + 1.128368590e-01f) * t -
               3.761263114e-01f) * t + 1.283791662e-01f;
    float a = __builtin_fabsf(x);
    a = a > 4.0f ? 4.0f : a;
    float u = a - 2.5f;
    float q = (((((((((-1.669940831e-08f * u - 9.733702999e-08f) * u + 1.744765890e-06f) * u -
                     1.285625543e-05f) * u + 7.708404639e-05f) * u - 4.208582542e-04f) * u +
                  2.165441211e-03f) * u - 1.085809549e-02f) * u + 5.610627413e-02f) * u -
              3.526807490e-01f) * u - 1.556815273e+00f;
    float big = __builtin_copysignf(1.0f - exp_f32(q - a * a), x);
    return __builtin_fabsf(x) < 1.25f ? x + x * p : big;
}

/* -- N-d strided iteration -------------------------------------------------------------- */
static inline int row_count(const int *d) {
    int rows = 1;
    for (int i = 0; i < d[0] - 1; i++) rows *= d[1 + i];
    return rows;
}

/* element offset of row r in operand k */
static inline int row_offset(const int *d, int r, int k) {
    int nd = d[0], off = 0;
    const int *stride = d + 1 + nd * (1 + k);
    for (int i = nd - 2; i >= 0; i--) {
        int n = d[1 + i];
        off += (r % n) * stride[i];
        r /= n;
    }
    return off;
}

#define LAST_STRIDE(d, k) ((d)[(d)[0] * (2 + (k))])

/* Loop hints that keep the module small: strided loops stay scalar (wasm has no gathers, so
 * their vector code would be long and no faster); contiguous loops vectorise without
 * interleaving copies. */
#ifndef SCALAR_LOOP  /* (native.h: no hints, size does not matter there) */
#define SCALAR_LOOP _Pragma("clang loop vectorize(disable) unroll(disable)")
#define VECTOR_LOOP _Pragma("clang loop vectorize(enable) interleave_count(1) unroll(disable)")
#endif

/* out = EXPR(x): unary ops, casts, copies (strided in, strided out) */
#define MAP1(NAME, TO, TA, EXPR)                                                             \
    EXPORT(NAME) void NAME(const int *d, TO *po, const TA *pa) {                            \
        int n = d[d[0]], rows = row_count(d), so = LAST_STRIDE(d, 0), sa = LAST_STRIDE(d, 1); \
        for (int r = 0; r < rows; r++) {                                                     \
            TO *__restrict out = po + row_offset(d, r, 0);                                   \
            const TA *__restrict in = pa + row_offset(d, r, 1);                              \
            if (so == 1 && sa == 1) {                                                        \
                VECTOR_LOOP for (int i = 0; i < n; i++) { TA x = in[i]; out[i] = (EXPR); }   \
            } else if (so == 1 && sa == 0) {                                                 \
                TA x = in[0]; TO v = (EXPR);                                                 \
                VECTOR_LOOP for (int i = 0; i < n; i++) out[i] = v;                          \
            } else {                                                                         \
                SCALAR_LOOP for (int i = 0; i < n; i++) { TA x = in[i * sa]; out[i * so] = (EXPR); } \
            }                                                                                \
        }                                                                                    \
    }

/* out = EXPR(a, b): binary ops with broadcasting (output contiguous) */
#define MAP2(NAME, TO, TA, EXPR)                                                             \
    EXPORT(NAME) void NAME(const int *d, TO *po, const TA *pa, const TA *pb) {              \
        int n = d[d[0]], rows = row_count(d);                                                \
        int sa = LAST_STRIDE(d, 1), sb = LAST_STRIDE(d, 2);                                  \
        for (int r = 0; r < rows; r++) {                                                     \
            TO *__restrict out = po + row_offset(d, r, 0);                                   \
            const TA *__restrict ra = pa + row_offset(d, r, 1);                              \
            const TA *__restrict rb = pb + row_offset(d, r, 2);                              \
            if (sa == 1 && sb == 1) {                                                        \
                VECTOR_LOOP for (int i = 0; i < n; i++) { TA a = ra[i], b = rb[i]; out[i] = (EXPR); } \
            } else if (sa == 1 && sb == 0) {                                                 \
                TA b = rb[0];                                                                \
                VECTOR_LOOP for (int i = 0; i < n; i++) { TA a = ra[i]; out[i] = (EXPR); }   \
            } else if (sa == 0 && sb == 1) {                                                 \
                TA a = ra[0];                                                                \
                VECTOR_LOOP for (int i = 0; i < n; i++) { TA b = rb[i]; out[i] = (EXPR); }   \
            } else {                                                                         \
                SCALAR_LOOP for (int i = 0; i < n; i++) {                                    \
                    TA a = ra[i * sa], b = rb[i * sb]; out[i] = (EXPR);                      \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

/* out = EXPR(c, a, b): where (c is bool) */
#define MAP3(NAME, TO, TC, TA, TB, EXPR)                                                     \
    EXPORT(NAME) void NAME(const int *d, TO *po, const TC *pc, const TA *pa, const TB *pb) {\
        int n = d[d[0]], rows = row_count(d);                                                \
        int sc = LAST_STRIDE(d, 1), sa = LAST_STRIDE(d, 2), sb = LAST_STRIDE(d, 3);          \
        for (int r = 0; r < rows; r++) {                                                     \
            TO *__restrict out = po + row_offset(d, r, 0);                                   \
            const TC *__restrict rc = pc + row_offset(d, r, 1);                              \
            const TA *__restrict ra = pa + row_offset(d, r, 2);                              \
            const TB *__restrict rb = pb + row_offset(d, r, 3);                              \
            SCALAR_LOOP for (int i = 0; i < n; i++) {                                        \
                TC c = rc[i * sc]; TA a = ra[i * sa]; TB b = rb[i * sb]; out[i] = (EXPR);    \
            }                                                                                \
        }                                                                                    \
    }

/* reduce the middle axis of a contiguous (outer, n, inner) array into (outer, inner) */
#define REDUCE(NAME, T, INIT, COMBINE)                                                       \
    EXPORT(NAME) void NAME(T *po, const T *px, int outer, int n, int inner) {               \
        for (int p = 0; p < outer; p++) {                                                    \
            T *__restrict out = po + p * inner;                                              \
            const T *__restrict in = px + p * n * inner;                                     \
            if (inner == 1) {                                                                \
                /* four partial results: shorter dependency chains, and for float sums a    \
                   smaller rounding error than one running total */                         \
                T r0 = INIT, r1 = INIT, r2 = INIT, r3 = INIT, acc, x;                        \
                int j = 0;                                                                   \
                for (; j + 4 <= n; j += 4) {                                                 \
                    acc = r0; x = in[j]; r0 = (COMBINE);                                     \
                    acc = r1; x = in[j + 1]; r1 = (COMBINE);                                 \
                    acc = r2; x = in[j + 2]; r2 = (COMBINE);                                 \
                    acc = r3; x = in[j + 3]; r3 = (COMBINE);                                 \
                }                                                                            \
                for (; j < n; j++) { acc = r0; x = in[j]; r0 = (COMBINE); }                  \
                acc = r0; x = r1; r0 = (COMBINE);                                            \
                acc = r2; x = r3; r2 = (COMBINE);                                            \
                acc = r0; x = r2; out[0] = (COMBINE);                                        \
            } else {                                                                         \
                VECTOR_LOOP for (int k = 0; k < inner; k++) out[k] = INIT;                   \
                for (int j = 0; j < n; j++) {                                                \
                    const T *__restrict row = in + j * inner;                                \
                    VECTOR_LOOP for (int k = 0; k < inner; k++) {                            \
                        T acc = out[k], x = row[k]; out[k] = (COMBINE);                      \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

/* index of the best element along the middle axis: the first one wins, a NaN beats all */
#define ARG_REDUCE(NAME, T, BETTER)                                                          \
    EXPORT(NAME) void NAME(int *po, const T *px, int outer, int n, int inner) {             \
        for (int p = 0; p < outer; p++)                                                      \
            for (int k = 0; k < inner; k++) {                                                \
                const T *in = px + p * n * inner + k;                                        \
                T best = in[0];                                                              \
                int at = 0;                                                                  \
                for (int j = 1; j < n; j++) {                                                \
                    T x = in[j * inner];                                                     \
                    if (best == best && ((BETTER) || x != x)) { best = x; at = j; }          \
                }                                                                            \
                po[p * inner + k] = at;                                                      \
            }                                                                                \
    }

/* torch.gather over the index's shape: operand 0 = out, 1 = x (its stride along the axis is
 * 0 in d; the index value times axis_stride is added), 2 = index. Returns -1, or the flat
 * position of the first index outside [-size, size) (the host reports it; nothing is read). */
#define GATHER(NAME, T)                                                                      \
    EXPORT(NAME) int NAME(const int *d, T *po, const T *px, const int *pi, int size,        \
                          int axis_stride) {                                                 \
        int n = d[d[0]], rows = row_count(d);                                                \
        int so = LAST_STRIDE(d, 0), sx = LAST_STRIDE(d, 1), si = LAST_STRIDE(d, 2);          \
        for (int r = 0; r < rows; r++) {                                                     \
            T *out = po + row_offset(d, r, 0);                                               \
            const T *x = px + row_offset(d, r, 1);                                           \
            const int *idx = pi + row_offset(d, r, 2);                                       \
            for (int i = 0; i < n; i++) {                                                    \
                int v = idx[i * si];                                                         \
                if (v < 0) v += size;                                                        \
                if (v < 0 || v >= size) return r * n + i;                                    \
                out[i * so] = x[i * sx + v * axis_stride];                                   \
            }                                                                                \
        }                                                                                    \
        return -1;                                                                           \
    }

/* torch.scatter_add into out (already a copy of x): operand 0 = out (stride 0 along the
 * axis), 1 = src, 2 = index. Checks every index first, so a bad one changes nothing. */
#define SCATTER_ADD(NAME, T, ADD)                                                            \
    EXPORT(NAME) int NAME(const int *d, T *po, const T *ps, const int *pi, int size,        \
                          int axis_stride) {                                                 \
        int n = d[d[0]], rows = row_count(d);                                                \
        int so = LAST_STRIDE(d, 0), ss = LAST_STRIDE(d, 1), si = LAST_STRIDE(d, 2);          \
        for (int r = 0; r < rows; r++) {                                                     \
            const int *idx = pi + row_offset(d, r, 2);                                       \
            for (int i = 0; i < n; i++) {                                                    \
                int v = idx[i * si];                                                         \
                if (v < -size || v >= size) return r * n + i;                                \
            }                                                                                \
        }                                                                                    \
        for (int r = 0; r < rows; r++) {                                                     \
            T *out = po + row_offset(d, r, 0);                                               \
            const T *src = ps + row_offset(d, r, 1);                                         \
            const int *idx = pi + row_offset(d, r, 2);                                       \
            for (int i = 0; i < n; i++) {                                                    \
                int v = idx[i * si];                                                         \
                if (v < 0) v += size;                                                        \
                T *at = out + i * so + v * axis_stride, b = src[i * ss], a = *at;            \
                *at = (ADD);                                                                 \
            }                                                                                \
        }                                                                                    \
        return -1;                                                                           \
    }

/* -- creation ---------------------------------------------------------------------------- */
EXPORT(fill_32) void fill_32(int *o, int n, int bits) { for (int i = 0; i < n; i++) o[i] = bits; }
EXPORT(fill_8) void fill_8(u8 *o, int n, int v) { memset(o, v, (size_t)n); }

/* the counter-based generator of core/backend.py (RANDOM) */
static inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
static inline double uniform(uint32_t i, uint32_t key) {
    return (double)(hash32(i ^ key) >> 8) * (1.0 / 16777216.0);
}
EXPORT(random_f32) void random_f32(float *o, int n, int key, int normal) {
    uint32_t k = (uint32_t)key;
    if (!normal) {
        for (int i = 0; i < n; i++) o[i] = (float)uniform((uint32_t)i, k);
        return;
    }
    for (int i = 0; i < n; i++) {  /* Box-Muller in double, rounded once, as NumPy does */
        double u1 = uniform(2u * (uint32_t)i, k), u2 = uniform(2u * (uint32_t)i + 1u, k);
        o[i] = (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
    }
}

/* -- matmul: register-blocked SIMD128 ---------------------------------------------------- */
#ifndef NATIVE_MATMUL  /* (native.h: the same tiles at the host's vector width) */
#define FMA4(acc, x, y) acc = wasm_f32x4_add(acc, wasm_f32x4_mul(x, y))

static inline float hsum(v128_t v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

/* o (M, N) = a (M, K) @ b (K, N), all row-major (o's rows ldo apart): 4x8 tiles held in
 * eight v128 registers, each step broadcasts one a value per row against two b vectors */
static void mm_nn(float *o, const float *a, const float *b, int M, int K, int N, int ldo) {
    int i = 0;
    for (; i + 4 <= M; i += 4) {
        const float *a0 = a + i * K, *a1 = a0 + K, *a2 = a1 + K, *a3 = a2 + K;
        float *o0 = o + i * ldo, *o1 = o0 + ldo, *o2 = o1 + ldo, *o3 = o2 + ldo;
        int j = 0;
        for (; j + 8 <= N; j += 8) {
            v128_t c00 = wasm_f32x4_splat(0), c01 = c00, c10 = c00, c11 = c00;
            v128_t c20 = c00, c21 = c00, c30 = c00, c31 = c00;
            const float *bk = b + j;
            for (int k = 0; k < K; k++, bk += N) {
                v128_t b0 = wasm_v128_load(bk), b1 = wasm_v128_load(bk + 4), x;
                x = wasm_f32x4_splat(a0[k]); FMA4(c00, x, b0); FMA4(c01, x, b1);
                x = wasm_f32x4_splat(a1[k]); FMA4(c10, x, b0); FMA4(c11, x, b1);
                x = wasm_f32x4_splat(a2[k]); FMA4(c20, x, b0); FMA4(c21, x, b1);
                x = wasm_f32x4_splat(a3[k]); FMA4(c30, x, b0); FMA4(c31, x, b1);
            }
            wasm_v128_store(o0 + j, c00); wasm_v128_store(o0 + j + 4, c01);
            wasm_v128_store(o1 + j, c10); wasm_v128_store(o1 + j + 4, c11);
            wasm_v128_store(o2 + j, c20); wasm_v128_store(o2 + j + 4, c21);
            wasm_v128_store(o3 + j, c30); wasm_v128_store(o3 + j + 4, c31);
        }
        /* a 4-wide column block left (narrow products: a convolution panel of 4 pixels) */
        for (; j + 4 <= N; j += 4) {
            v128_t c0 = wasm_f32x4_splat(0), c1 = c0, c2 = c0, c3 = c0;
            const float *bk = b + j;
            for (int k = 0; k < K; k++, bk += N) {
                v128_t b0 = wasm_v128_load(bk);
                FMA4(c0, wasm_f32x4_splat(a0[k]), b0); FMA4(c1, wasm_f32x4_splat(a1[k]), b0);
                FMA4(c2, wasm_f32x4_splat(a2[k]), b0); FMA4(c3, wasm_f32x4_splat(a3[k]), b0);
            }
            wasm_v128_store(o0 + j, c0); wasm_v128_store(o1 + j, c1);
            wasm_v128_store(o2 + j, c2); wasm_v128_store(o3 + j, c3);
        }
        for (; j < N; j++) {
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int k = 0; k < K; k++) {
                float y = b[k * N + j];
                s0 += a0[k] * y; s1 += a1[k] * y; s2 += a2[k] * y; s3 += a3[k] * y;
            }
            o0[j] = s0; o1[j] = s1; o2[j] = s2; o3[j] = s3;
        }
    }
    for (; i < M; i++) {
        const float *ar = a + i * K;
        float *orow = o + i * ldo;
        int j = 0;
        for (; j + 8 <= N; j += 8) {
            v128_t c0 = wasm_f32x4_splat(0), c1 = c0;
            const float *bk = b + j;
            for (int k = 0; k < K; k++, bk += N) {
                v128_t x = wasm_f32x4_splat(ar[k]);
                FMA4(c0, x, wasm_v128_load(bk)); FMA4(c1, x, wasm_v128_load(bk + 4));
            }
            wasm_v128_store(orow + j, c0); wasm_v128_store(orow + j + 4, c1);
        }
        for (; j < N; j++) {
            float s = 0;
            for (int k = 0; k < K; k++) s += ar[k] * b[k * N + j];
            orow[j] = s;
        }
    }
}

/* o (M, N) = a (M, K) @ bt (N, K)^T: dot products along contiguous K (Linear's x @ W.T),
 * one a row against four bt rows at a time (o's rows ldo apart) */
static void mm_nt(float *o, const float *a, const float *bt, int M, int K, int N, int ldo) {
    int k4 = K & ~3;
    for (int i = 0; i < M; i++) {
        const float *ar = a + i * K;
        float *orow = o + i * ldo;
        int j = 0;
        for (; j + 4 <= N; j += 4) {
            const float *b0 = bt + j * K, *b1 = b0 + K, *b2 = b1 + K, *b3 = b2 + K;
            v128_t c0 = wasm_f32x4_splat(0), c1 = c0, c2 = c0, c3 = c0;
            for (int k = 0; k < k4; k += 4) {
                v128_t x = wasm_v128_load(ar + k);
                FMA4(c0, x, wasm_v128_load(b0 + k)); FMA4(c1, x, wasm_v128_load(b1 + k));
                FMA4(c2, x, wasm_v128_load(b2 + k)); FMA4(c3, x, wasm_v128_load(b3 + k));
            }
            float s0 = hsum(c0), s1 = hsum(c1), s2 = hsum(c2), s3 = hsum(c3);
            for (int k = k4; k < K; k++) {
                float x = ar[k];
                s0 += x * b0[k]; s1 += x * b1[k]; s2 += x * b2[k]; s3 += x * b3[k];
            }
            orow[j] = s0; orow[j + 1] = s1; orow[j + 2] = s2; orow[j + 3] = s3;
        }
        for (; j < N; j++) {
            const float *br = bt + j * K;
            v128_t c = wasm_f32x4_splat(0);
            for (int k = 0; k < k4; k += 4) FMA4(c, wasm_v128_load(ar + k), wasm_v128_load(br + k));
            float s = hsum(c);
            for (int k = k4; k < K; k++) s += ar[k] * br[k];
            orow[j] = s;
        }
    }
}

#endif

/* The threads' share of a product: items are blocks of MM_ROWS rows of each batch's product,
 * or, for a transposed b with few rows (Linear at batch 1), blocks of MM_COLS columns; a range
 * of items is one mm_nn/mm_nt call per batch (one call for all of them in one thread). */
#define MM_ROWS 4   /* mm_nn's tile height */
#define MM_COLS 16
typedef struct {
    float *o;
    const float *a, *b;
    int M, K, N, ldo, o_stride, a_stride, b_stride, transposed, by_columns, blocks;
} mm_job;

static void mm_task(const void *args, int begin, int end) {
    const mm_job *j = (const mm_job *)args;
    int step = j->by_columns ? MM_COLS : MM_ROWS, size = j->by_columns ? j->N : j->M;
    for (int p = begin / j->blocks; p * j->blocks < end; p++) {
        int from = (begin > p * j->blocks ? begin - p * j->blocks : 0) * step;
        int to = (end - p * j->blocks) * step;
        if (to > size) to = size;
        float *o = j->o + p * j->o_stride;
        const float *a = j->a + p * j->a_stride, *b = j->b + p * j->b_stride;
        if (j->by_columns) mm_nt(o + from, a, b + from * j->K, j->M, j->K, to - from, j->ldo);
        else if (j->transposed) mm_nt(o + from * j->ldo, a + from * j->K, b, to - from, j->K, j->N, j->ldo);
        else mm_nn(o + from * j->ldo, a + from * j->K, b, to - from, j->K, j->N, j->ldo);
    }
}

/* batch products o[p] (M, N), rows ldo apart, o[p] o_stride after o[p - 1]; a, b likewise */
static void mm_parallel(float *o, const float *a, const float *b, int batch, int M, int K, int N,
                        int ldo, int o_stride, int a_stride, int b_stride, int transposed) {
    int by_columns = transposed && M < 2 * MM_ROWS;
    int blocks = by_columns ? (N + MM_COLS - 1) / MM_COLS : (M + MM_ROWS - 1) / MM_ROWS;
    if (blocks == 0) return;
    mm_job job = { o, a, b, M, K, N, ldo, o_stride, a_stride, b_stride, transposed, by_columns, blocks };
    parallel_for(mm_task, &job, batch * blocks, (double)batch * M * K * N);
}

/* batched: out (batch, M, N) contiguous; a and b advance by their batch strides (0 when a
 * batch dim broadcasts); transposed_b: b is stored (N, K) */
EXPORT(matmul_f32) void matmul_f32(float *o, const float *a, const float *b, int batch, int M,
                                   int K, int N, int a_batch_stride, int b_batch_stride,
                                   int transposed_b) {
    mm_parallel(o, a, b, batch, M, K, N, N, M * N, a_batch_stride, b_batch_stride, transposed_b);
}

/* C (M, N) = A (M, K) @ dequantize(B), B's values read from 8-bit or packed 4-bit storage
 * (weights that stay quantized: core/backend.py "quantized_matmul"). p = [M, N, K, block, q_off,
 * q_sk, q_sn, s_sb, s_sn, z_off, z_sb, z_sn, z_default, bits, zp_bits, q_signed, z_code (0 none,
 * 1 int8, 2 uint8, 3 int32), integer, a_scaled]. B's value (k, n) is element q_off + k * q_sk + n * q_sn
 * of q (bits 4: nibbles, low first; bits 16: float16, widened, no scale or zero point); its
 * block's scale s[blk * s_sb + n * s_sn] and zero point likewise. B is dequantized one panel
 * at a time (all of K by a few columns, Q_PANEL values:
 * float32 (q - zp) * scale, or int32 q - zp when integer: A and C int32, exact wrapping sums)
 * and the panel is multiplied by all of A (float: mm_nn's SIMD tiles), so each weight is
 * dequantized once per call and no more than one panel is ever held in float. */
#define Q_PANEL 16384
static float q_panel[Q_PANEL];
/* a float16 B's panel: 4x the 8-bit one, so that a conv's long K (C * kh * kw, up to 4,608 in
 * ResNets) still gives mm_nn columns in multiples of 8 */
#define H_PANEL 65536
static float h_panel[H_PANEL];

/* f16_to_f32 without branches, so that the loops filling h_panel vectorise (a batch-1 layer
 * widens each weight once per call: at ResNet's late layers that is most of the work) */
static inline float f16_widen(uint16_t h) {
    uint32_t em = (uint32_t)(h & 0x7fff) << 13, e = h & 0x7c00;
    union { uint32_t i; float f; } normal = { em + (112u << 23) }, small;
    small.f = (float)(h & 0x3ff) * 5.9604645e-8f;   /* subnormal: m * 2^-24 */
    normal.i = (e == 0 ? small.i : e == 0x7c00 ? (em | 0x7f800000u) : normal.i) | (uint32_t)(h & 0x8000) << 16;
    return normal.f;
}
static int q_zp[Q_PANEL / 8];
static float q_scale[Q_PANEL / 8];

static inline int q_at(const void *q, int e, int bits, int is_signed) {
    if (bits == 4) return (((const u8 *)q)[e >> 1] >> ((e & 1) * 4)) & 15;
    return is_signed ? ((const signed char *)q)[e] : ((const u8 *)q)[e];
}

/* q_zp[j], q_scale[j] <- the zero point and scale of block blk of columns n0 .. n0 + nn */
static void q_block_params(const int *p, const float *s, const void *z, int blk, int n0, int nn) {
    int s_sb = p[7], s_sn = p[8], z_off = p[9], z_sb = p[10], z_sn = p[11], z_default = p[12];
    int zp_bits = p[14], z_code = p[16], integer = p[17];
    for (int j = 0; j < nn; j++) {
        int n = n0 + j, ze = z_off + blk * z_sb + n * z_sn;
        q_zp[j] = z_code == 3 ? ((const int *)z)[ze]
                : z_code ? q_at(z, ze, zp_bits, z_code == 1) : z_default;
        q_scale[j] = integer || !s ? 1.0f : s[blk * s_sb + n * s_sn];   /* (fill_pairs: no s) */
    }
}

/* panel <- B[:, n0:n0 + nn] dequantized (ints stored in the float array's bits when integer),
 * in runs of rows that share a block: (K, nn) row-major, or (nn, K) when `transposed` (B's K
 * contiguous, as MatMulNBits stores it), so that q is read and the panel written in order */
static void q_fill(const int *p, const void *q, const float *s, const void *z, int n0, int nn,
                   int transposed) {
    int K = p[2], block = p[3], q_off = p[4], q_sk = p[5], q_sn = p[6], bits = p[13];
    int q_signed = p[15], integer = p[17];
    int *ints = (int *)q_panel;
    if (bits == 16) {   /* float16 B (a half model's weight): widened into (K, nn) for mm_nn */
        const uint16_t *h = (const uint16_t *)q + q_off + n0 * q_sn;
        float *panel = h_panel;
        if (q_sk == 1) {   /* B's k contiguous (conv and Gemm weights stored (N, K)): read in order */
            for (int j = 0; j < nn; j++)
                for (int k = 0; k < K; k++) panel[k * nn + j] = f16_widen(h[j * q_sn + k]);
        } else {
            for (int k = 0; k < K; k++)
                for (int j = 0; j < nn; j++) panel[k * nn + j] = f16_widen(h[k * q_sk + j * q_sn]);
        }
        return;
    }
    for (int k0 = 0; k0 < K; k0 += block) {
        int k1 = k0 + block < K ? k0 + block : K;
        q_block_params(p, s, z, k0 / block, n0, nn);
        if (bits == 8 && q_sn == 1 && !transposed && !integer) {   /* (float: the hot case) */
            for (int k = k0; k < k1; k++) {
                int base = q_off + k * q_sk + n0;
                /* one loop for int8 and uint8: a byte read signed, masked to 0..255 for uint8 */
                const signed char *qs = (const signed char *)q + base;
                int mask = q_signed ? -1 : 0xFF;
                float *row = q_panel + k * nn;
                for (int j = 0; j < nn; j++) row[j] = (float)((qs[j] & mask) - q_zp[j]) * q_scale[j];
            }
        } else {
            for (int j = 0; j < nn; j++) {
                int base = q_off + (n0 + j) * q_sn, zp = q_zp[j];
                float sc = q_scale[j];
                int at = transposed ? j * K : j, step = transposed ? 1 : nn;
                for (int k = k0; k < k1; k++) {
                    int v = q_at(q, base + k * q_sk, bits, q_signed) - zp;
                    if (integer) ints[at + k * step] = v;
                    else q_panel[at + k * step] = (float)v * sc;
                }
            }
        }
    }
}

/* -- the exact integer product on i32x4.dot_i16x8_s -------------------------------------- */
/* MatMulInteger's operands are differences of 8-bit values (|v| <= 255): they fit int16, and
 * one i32x4.dot_i16x8_s multiplies 8 pairs and adds them two by two into 4 int32 lanes (sums
 * wrap as int32 sums do, so the result is exact), twice the products of an f32x4 multiply-add
 * on a quarter of the bytes. Both operands hold k in pairs: A's rows as int16 (K rounded up to
 * even, 0 padded), the B panel as (K/2, nn, 2) int16, so one 32-bit splat of A's pair (k, k+1)
 * meets four columns' pairs in one vector. */
#define DOT2(acc, x, y) acc = wasm_i32x4_add(acc, wasm_i32x4_dot_i16x8(x, y))
/* (unrolled, so that the accumulators live in registers: the build says -fno-unroll-loops) */
#define ROWS_LOOP _Pragma("clang loop unroll(full)")

#ifndef NATIVE_PAIRS  /* (native.h: the same tiles at the host's vector width) */
/* ROWS (4 or 1) rows of o (rows ldo apart) = a's pairs (rows K2 apart) @ the panel's N columns
 * (N a multiple of 4): 8 columns per step, then 4 */
static inline __attribute__((always_inline)) void
mm_pairs_rows(int *o, const int *a, const short *b, int ROWS, int K2, int N, int ldo) {
    int j = 0;
    for (; j + 8 <= N; j += 8) {
        v128_t c[4][2];
        ROWS_LOOP for (int r = 0; r < ROWS; r++) c[r][0] = c[r][1] = wasm_i32x4_splat(0);
        const short *bk = b + 2 * j;
        for (int k = 0; k < K2; k++, bk += 2 * N) {
            v128_t b0 = wasm_v128_load(bk), b1 = wasm_v128_load(bk + 8);
            ROWS_LOOP for (int r = 0; r < ROWS; r++) {
                v128_t x = wasm_i32x4_splat(a[r * K2 + k]);
                DOT2(c[r][0], x, b0); DOT2(c[r][1], x, b1);
            }
        }
        ROWS_LOOP for (int r = 0; r < ROWS; r++) {
            wasm_v128_store(o + r * ldo + j, c[r][0]); wasm_v128_store(o + r * ldo + j + 4, c[r][1]);
        }
    }
    for (; j < N; j += 4) {
        v128_t c[4];
        ROWS_LOOP for (int r = 0; r < ROWS; r++) c[r] = wasm_i32x4_splat(0);
        const short *bk = b + 2 * j;
        for (int k = 0; k < K2; k++, bk += 2 * N) {
            v128_t b0 = wasm_v128_load(bk);
            ROWS_LOOP for (int r = 0; r < ROWS; r++) DOT2(c[r], wasm_i32x4_splat(a[r * K2 + k]), b0);
        }
        ROWS_LOOP for (int r = 0; r < ROWS; r++) wasm_v128_store(o + r * ldo + j, c[r]);
    }
}

/* o (M, nn) int32 (rows ldo apart) = a16 (M, 2 * K2) @ the (K2, nn, 2) panel; nn % 4 == 0 */
static void mm_pairs(int *o, const short *a16, const short *panel, int M, int K2, int nn,
                     int ldo) {
    const int *a = (const int *)a16;   /* (k, k+1) pairs as one int32 each */
    int i = 0;
    for (; i + 4 <= M; i += 4) mm_pairs_rows(o + i * ldo, a + i * K2, panel, 4, K2, nn, ldo);
    for (; i < M; i++) mm_pairs_rows(o + i * ldo, a + i * K2, panel, 1, K2, nn, ldo);
}
#endif

/* a16 (M, K2 * 2) <- a (M, K) int32, or (inv != 0) the integers rint(a * inv) of float32 a (a
 * QDQ graph's dequantized activation, inv = 1 / its scale, as conv2d_quantized reads x), 0 past
 * K; 0 when a value does not fit int16 (then the product takes the general loop). 8 values per
 * step: the range kept in two vectors, the int16 values by a saturating narrow (a float past
 * int32's range saturates, and so lands outside int16 too; NaN is 0, as trunc_f32_i32 makes it) */
static inline v128_t pair_ints(const void *a, int k, v128_t inv4, int scaled) {
    if (!scaled) return wasm_v128_load((const int *)a + k);
    return wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(wasm_v128_load((const float *)a + k), inv4)));
}

static int pack_pairs(short *a16, const void *a, int M, int K, float inv) {
    int K2 = (K + 1) / 2, scaled = inv != 0.0f, outside = 0;
    v128_t lo = wasm_i32x4_splat(0), hi = lo, inv4 = wasm_f32x4_splat(inv);
    for (int m = 0; m < M; m++, a16 += 2 * K2) {
        const void *row = scaled ? (const void *)((const float *)a + m * K) : (const void *)((const int *)a + m * K);
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            v128_t v0 = pair_ints(row, k, inv4, scaled), v1 = pair_ints(row, k + 4, inv4, scaled);
            lo = wasm_i32x4_min(lo, wasm_i32x4_min(v0, v1));
            hi = wasm_i32x4_max(hi, wasm_i32x4_max(v0, v1));
            wasm_v128_store(a16 + k, wasm_i16x8_narrow_i32x4(v0, v1));
        }
        for (; k < K; k++) {
            int v = scaled ? trunc_f32_i32(__builtin_rintf(((const float *)row)[k] * inv)) : ((const int *)row)[k];
            outside |= (unsigned)(v + 32768) > 65535u;
            a16[k] = (short)v;
        }
        if (K & 1) a16[K] = 0;
    }
    lo = wasm_i32x4_lt(lo, wasm_i32x4_splat(-32768));
    hi = wasm_i32x4_gt(hi, wasm_i32x4_splat(32767));
    return !outside && !wasm_v128_any_true(wasm_v128_or(lo, hi));
}

/* the (K2, nn, 2) int16 panel of B[:, n0:n0 + nn] - zero point (8-bit B), its columns past nn
 * up to `width` and the k past K 0: n contiguous B 8 columns per shuffle, any other layout
 * (a Gemm's transposed weight, k contiguous) value by value */
static void fill_pairs(const int *p, const void *q, const void *z, int n0, int nn, int width) {
    int K = p[2], block = p[3], q_off = p[4], q_sk = p[5], q_sn = p[6], mask = p[15] ? -1 : 0xFF;
    short *panel = (short *)q_panel;
    if ((K & 1) || width > nn) memset(panel, 0, sizeof(short) * 2 * width * ((K + 1) / 2));
    for (int k0 = 0; k0 < K; k0 += block) {
        int k1 = k0 + block < K ? k0 + block : K;
        q_block_params(p, 0, z, k0 / block, n0, nn);
        if (q_sn != 1) {
            for (int j = 0; j < nn; j++) {
                const signed char *qs = (const signed char *)q + q_off + (n0 + j) * q_sn;
                for (int k = k0; k < k1; k++)
                    panel[(k >> 1) * 2 * width + 2 * j + (k & 1)] = (short)((qs[k * q_sk] & mask) - q_zp[j]);
            }
            continue;
        }
        for (int k = k0; k < k1; k++) {
            const signed char *qs = (const signed char *)q + q_off + k * q_sk + n0;
            short *row = panel + (k >> 1) * 2 * width + (k & 1);
            int j = 0;
            if (!(k & 1) && k + 1 < k1) {   /* rows k and k + 1: 8 columns' pairs per shuffle */
                const signed char *qs1 = qs + q_sk;
                for (; j + 8 <= nn; j += 8) {
                    v128_t z8 = wasm_i16x8_narrow_i32x4(wasm_v128_load(q_zp + j), wasm_v128_load(q_zp + j + 4));
                    v128_t r0 = mask < 0 ? wasm_i16x8_load8x8(qs + j) : wasm_u16x8_load8x8(qs + j);
                    v128_t r1 = mask < 0 ? wasm_i16x8_load8x8(qs1 + j) : wasm_u16x8_load8x8(qs1 + j);
                    r0 = wasm_i16x8_sub(r0, z8);
                    r1 = wasm_i16x8_sub(r1, z8);
                    wasm_v128_store(row + 2 * j, wasm_i16x8_shuffle(r0, r1, 0, 8, 1, 9, 2, 10, 3, 11));
                    wasm_v128_store(row + 2 * j + 8, wasm_i16x8_shuffle(r0, r1, 4, 12, 5, 13, 6, 14, 7, 15));
                }
                for (int t = j; t < nn; t++) row[2 * t + 1] = (short)((qs1[t] & mask) - q_zp[t]);
            }
            for (; j < nn; j++) row[2 * j] = (short)((qs[j] & mask) - q_zp[j]);
            if (!(k & 1) && k + 1 < k1) k++;
        }
    }
}

/* The integer product takes the pairs when B is 8-bit with an 8-bit zero point (|q - zp| <= 255),
 * a panel holds 4 columns of K (K <= Q_PANEL / 2) and A's values fit int16; and so does the
 * float product where A is a QDQ activation (a_scaled: its integers are rint(a / *as)) and B has
 * one block (its scale per column or per tensor): C = the int32 sums * *as * scale. Else the
 * general loop below (a_scaled or not: a @ dequantize(B) in float32). scratch: (M, K rounded
 * up to even) int16 for A's pairs (unused by the float product). */
EXPORT(matmul_quantized) void matmul_quantized(void *o, const void *a, const void *q,
                                               const float *s, const void *z, const int *p,
                                               short *scratch, const float *as) {
    int M = p[0], N = p[1], K = p[2], integer = p[17], transposed = p[5] == 1 && p[6] != 1;
    int a_scaled = p[18] && p[3] >= K;
    int zp_8bit = p[16] == 1 || p[16] == 2 || (p[16] == 0 && p[12] >= -255 && p[12] <= 255);
    if ((integer || a_scaled) && p[13] == 8 && zp_8bit && K <= Q_PANEL / 2 &&
        pack_pairs(scratch, a, M, K, integer ? 0.0f : 1.0f / *as)) {
        int K2 = (K + 1) / 2, width = (2 * Q_PANEL / (2 * K2)) & ~7;
        if (width < 4) width = 4;
        if (width > Q_PANEL / 8) width = Q_PANEL / 8;
        int N4 = N & ~3;
        for (int n0 = 0; n0 < N4; n0 += width) {
            int nn = N4 - n0 < width ? N4 - n0 : width;
            fill_pairs(p, q, z, n0, nn, nn);
            mm_pairs((int *)o + n0, scratch, (const short *)q_panel, M, K2, nn, N);
        }
        if (N4 < N) {   /* the last N % 4 columns: a 4-wide panel whose padding columns are not stored */
            int tail[4];
            fill_pairs(p, q, z, N4, N - N4, 4);
            for (int m = 0; m < M; m++) {
                mm_pairs(tail, scratch + m * 2 * K2, (const short *)q_panel, 1, K2, 4, 4);
                for (int j = 0; j < N - N4; j++) ((int *)o)[m * N + N4 + j] = tail[j];
            }
        }
        if (integer) return;
        /* the sums (as int32 in o) times a's scale and the column's, in place */
        float *scale = q_scale;
        for (int n0 = 0; n0 < N; n0 += Q_PANEL / 8) {
            int nn = N - n0 < Q_PANEL / 8 ? N - n0 : Q_PANEL / 8;
            for (int j = 0; j < nn; j++) scale[j] = *as * s[(n0 + j) * p[8]];
            for (int m = 0; m < M; m++) {
                int *acc = (int *)o + m * N + n0;
                float *row = (float *)acc;
                for (int j = 0; j < nn; j++) row[j] = (float)acc[j] * scale[j];
            }
        }
        return;
    }
    if (p[13] == 16) {   /* float16 B: its own panel, always (K, nn) */
        int width = (H_PANEL / K) & ~7;
        if (width < 8) width = H_PANEL / K > 0 ? H_PANEL / K : 1;
        for (int n0 = 0; n0 < N; n0 += width) {
            int nn = N - n0 < width ? N - n0 : width;
            q_fill(p, q, s, z, n0, nn, 0);
            mm_nn((float *)o + n0, (const float *)a, h_panel, M, K, nn, N);
        }
        return;
    }
    int width = (Q_PANEL / K) & ~7;   /* panel columns: a multiple of mm_nn's 8 */
    if (width < 8) width = Q_PANEL / K > 0 ? Q_PANEL / K : 1;
    if (width > Q_PANEL / 8) width = Q_PANEL / 8;
    for (int n0 = 0; n0 < N; n0 += width) {
        int nn = N - n0 < width ? N - n0 : width;
        q_fill(p, q, s, z, n0, nn, transposed);
        if (!integer) {
            if (transposed) mm_nt((float *)o + n0, (const float *)a, q_panel, M, K, nn, N);
            else mm_nn((float *)o + n0, (const float *)a, q_panel, M, K, nn, N);
            continue;
        }
        const int *panel = (const int *)q_panel;
        for (int m = 0; m < M; m++) {
            const int *ar = (const int *)a + m * K;
            unsigned *crow = (unsigned *)o + m * N + n0;
            for (int j = 0; j < nn; j++) crow[j] = 0u;
            for (int k = 0; k < K; k++) {
                unsigned ak = (unsigned)ar[k];
                for (int j = 0; j < nn; j++)
                    crow[j] += ak * (unsigned)panel[transposed ? j * K + k : k * nn + j];
            }
        }
    }
}

/* ONNX DynamicQuantizeLinear of x (n values, contiguous): y (int32, 0..255), its scale
 * (float32) and zero point (int32), with the float32 arithmetic of the composition in
 * core/onnx/ops/quantization.py (NaN propagates through min and max, rounding half to even):
 * one pass for the range, one to quantize, instead of a dozen elementwise kernels */
EXPORT(dynamic_quantize_f32) void dynamic_quantize_f32(int *y, const float *x, float *scale_out,
                                                       int *zp_out, int n) {
    /* pmin/pmax (one instruction each on x86; min/max, which propagate NaN, are half a dozen in
     * V8 and Wasmtime) keep the range when v is NaN: the range skips NaN, as onnxruntime's
     * (core/onnx/ops/quantization.py); the scalar tail compares the same way */
    v128_t lo4 = wasm_f32x4_splat(0.0f), hi4 = lo4;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        v128_t v = wasm_v128_load(x + i);
        lo4 = wasm_f32x4_pmin(lo4, v);
        hi4 = wasm_f32x4_pmax(hi4, v);
    }
    float lo = min_f32(min_f32(wasm_f32x4_extract_lane(lo4, 0), wasm_f32x4_extract_lane(lo4, 1)),
                       min_f32(wasm_f32x4_extract_lane(lo4, 2), wasm_f32x4_extract_lane(lo4, 3)));
    float hi = max_f32(max_f32(wasm_f32x4_extract_lane(hi4, 0), wasm_f32x4_extract_lane(hi4, 1)),
                       max_f32(wasm_f32x4_extract_lane(hi4, 2), wasm_f32x4_extract_lane(hi4, 3)));
    for (; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
    }
    float scale = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float zp = min_f32(max_f32(__builtin_rintf(-lo / scale), 0.0f), 255.0f);
    if (zp != zp) zp = 0.0f;   /* (-inf in x: inf / inf; NaN saturates to 0, as in y) */
    /* (-0 never arises: rint(..) + zp, zp >= +0; pmax(0, NaN) is 0, as trunc_f32_i32 makes NaN)
     * the integer 0..255 in the low bits of v + 2**23, whose exponent bits are 0x4B000000 */
    v128_t s4 = wasm_f32x4_splat(scale), z4 = wasm_f32x4_splat(zp);
    v128_t bottom = wasm_f32x4_splat(0.0f), top = wasm_f32x4_splat(255.0f);
    v128_t magic = wasm_f32x4_splat(8388608.0f), unbias = wasm_i32x4_splat(-0x4B000000);
    for (i = 0; i + 4 <= n; i += 4) {
        v128_t v = wasm_f32x4_add(wasm_f32x4_nearest(wasm_f32x4_div(wasm_v128_load(x + i), s4)), z4);
        v = wasm_f32x4_pmin(top, wasm_f32x4_pmax(bottom, v));
        wasm_v128_store(y + i, wasm_i32x4_add(wasm_f32x4_add(v, magic), unbias));
    }
    for (; i < n; i++)
        y[i] = trunc_f32_i32(min_f32(max_f32(__builtin_rintf(x[i] / scale) + zp, 0.0f), 255.0f));
    *scale_out = scale;
    *zp_out = (int)zp;
}

/* A QDQ graph's activation round trip, QuantizeLinear then DequantizeLinear with per-tensor
 * parameters (core/backend.py "quantize_dequantize"): y = (min(max(rint(x / ys) + yz, lo), hi)
 * - xz) * xs, the composition's float32 steps (NaN propagates as max_f32/min_f32 do) in one
 * pass instead of seven kernels. p = [n, lo, hi, yz_code, xz_code]: a zero point's code as
 * matmul_quantized's (0 none, 1 int8, 2 uint8, 3 int32). */
static inline float zero_point_at(const void *z, int code) {
    return code == 3 ? (float)*(const int *)z : code ? (float)q_at(z, 0, 8, code == 1) : 0.0f;
}

EXPORT(quantize_dequantize_f32) void quantize_dequantize_f32(float *y, const float *x, const float *ys,
                                                             const void *yz, const float *xs,
                                                             const void *xz, const int *p) {
    int n = p[0], i = 0;
    float lo = (float)p[1], hi = (float)p[2], ysc = *ys, xsc = *xs;
    float yzp = zero_point_at(yz, p[3]), xzp = zero_point_at(xz, p[4]);
    v128_t ys4 = wasm_f32x4_splat(ysc), yz4 = wasm_f32x4_splat(yzp), xs4 = wasm_f32x4_splat(xsc);
    v128_t xz4 = wasm_f32x4_splat(-xzp), lo4 = wasm_f32x4_splat(lo), hi4 = wasm_f32x4_splat(hi);
    for (; i + 4 <= n; i += 4) {
        v128_t v = wasm_f32x4_add(wasm_f32x4_nearest(wasm_f32x4_div(wasm_v128_load(x + i), ys4)), yz4);
        /* pmax/pmin (one instruction each) keep a NaN v where v is their first operand; v is
         * never -0 (rint(..) + yz, yz >= +0), so they order it as max/min do */
        v = wasm_f32x4_pmin(wasm_f32x4_pmax(v, lo4), hi4);
        wasm_v128_store(y + i, wasm_f32x4_mul(wasm_f32x4_add(v, xz4), xs4));   /* (v + -xz: v - xz exactly) */
    }
    for (; i < n; i++)
        y[i] = (min_f32(max_f32(__builtin_rintf(x[i] / ysc) + yzp, lo), hi) - xzp) * xsc;
}

/* -- images: im2col and its adjoint ------------------------------------------------------ */
/* g = [N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW] */
EXPORT(unfold2d_f32) void unfold2d_f32(float *o, const float *x, const int *g, int pad_bits) {
    int N = g[0], C = g[1], H = g[2], W = g[3], kh = g[4], kw = g[5], sh = g[6], sw = g[7];
    int ph = g[8], pw = g[9], dh = g[10], dw = g[11], OH = g[12], OW = g[13], L = OH * OW;
    float pad = bits_f32(pad_bits);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            const float *img = x + (n * C + c) * H * W;
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++) {
                    float *row = o + ((n * C + c) * kh * kw + i * kw + j) * L;
                    for (int oh = 0; oh < OH; oh++) {
                        int ih = oh * sh - ph + i * dh;
                        float *out = row + oh * OW;
                        if (ih < 0 || ih >= H) {
                            for (int ow = 0; ow < OW; ow++) out[ow] = pad;
                            continue;
                        }
                        const float *src = img + ih * W;
                        for (int ow = 0; ow < OW; ow++) {
                            int iw = ow * sw - pw + j * dw;
                            out[ow] = (iw >= 0 && iw < W) ? src[iw] : pad;
                        }
                    }
                }
        }
}

EXPORT(fold2d_f32) void fold2d_f32(float *o, const float *cols, const int *g) {
    int N = g[0], C = g[1], H = g[2], W = g[3], kh = g[4], kw = g[5], sh = g[6], sw = g[7];
    int ph = g[8], pw = g[9], dh = g[10], dw = g[11], OH = g[12], OW = g[13], L = OH * OW;
    memset(o, 0, (size_t)N * C * H * W * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            float *img = o + (n * C + c) * H * W;
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++) {
                    const float *row = cols + ((n * C + c) * kh * kw + i * kw + j) * L;
                    for (int oh = 0; oh < OH; oh++) {
                        int ih = oh * sh - ph + i * dh;
                        if (ih < 0 || ih >= H) continue;
                        float *dst = img + ih * W;
                        for (int ow = 0; ow < OW; ow++) {
                            int iw = ow * sw - pw + j * dw;
                            if (iw >= 0 && iw < W) dst[iw] += row[oh * OW + ow];
                        }
                    }
                }
        }
}

/* -- conv2d without the whole im2col matrix ---------------------------------------------- */
/* conv2d_f32's epilogue over n values: + b, then the activation (codes: backend.py
 * _ACTIVATION_CODES; the formulas of functional.conv_activation; NaN propagates) */
static void conv_epilogue(float *v, int n, float b, int activation) {
    switch (activation) {
    case 0: VECTOR_LOOP for (int i = 0; i < n; i++) v[i] += b; break;
    case 1: VECTOR_LOOP for (int i = 0; i < n; i++) { float x = v[i] + b; v[i] = x <= 0.0f ? 0.0f : x; } break;
    case 2:
        VECTOR_LOOP for (int i = 0; i < n; i++) {
            float x = v[i] + b;
            x = x <= 0.0f ? 0.0f : x;
            v[i] = x >= 6.0f ? 6.0f : x;
        }
        break;
    case 3:  /* silu: x * sigmoid(x) */
        VECTOR_LOOP for (int i = 0; i < n; i++) { float x = v[i] + b; v[i] = x / (1.0f + exp_f32(-x)); }
        break;
    default:  /* 4 hardswish x * hardsigmoid(x), 5 hardsigmoid: clamp(x + 3, 0, 6) / 6 */
        VECTOR_LOOP for (int i = 0; i < n; i++) {
            float x = v[i] + b, h = x + 3.0f;
            h = h <= 0.0f ? 0.0f : h;
            h = (h >= 6.0f ? 6.0f : h) / 6.0f;
            v[i] = activation == 4 ? x * h : h;
        }
    }
}

/* g = [N, C, H, W, O, kh, kw, sh, sw, pt, pl, dh, dw, OH, OW, groups, has_bias, activation,
 *      panel]
 * x (N, C, H, W), w (O, C/groups, kh, kw), out (N, O, OH, OW), all contiguous; activation
 * 0 none, 1 relu, 2 relu6, 3 silu, 4 hardswish, 5 hardsigmoid (conv_epilogue). panel 0: the
 * depthwise loop (one input channel per group: each plane copied into a zero-padded one in
 * `scratch`, then each output row summed over its taps while it sits in L1, and its
 * epilogue); else `panel` output pixels at a time have their columns (C/groups * kh * kw of
 * them) gathered into `scratch` and multiplied by the group's weights with mm_nn straight into
 * the output, so the memory beyond input, weight and output is one panel, never the whole
 * matrix (a 1x1 convolution with stride 1 and no padding needs no panel: it is one matmul). */

/* the largest depthwise taps unrolled: 7x7 natively, 3x3 in the tab's module (each unrolled
 * 5x5 or 7x7 loop adds 3-4 KB to it) */
#ifdef __wasm__
#define DW_UNROLL_MAX 3
#else
#define DW_UNROLL_MAX 7
#endif

/* one output row of a depthwise convolution from a zero-padded plane (src: its row of tap
 * (0, 0), rows Wp apart): K x K taps, stride S, no dilation. Inlined with constant K and S: the
 * taps unroll, and the ox loop vectorises. */
static inline __attribute__((always_inline)) void dw_row(float *__restrict dst, const float *src,
                                                         const float *taps, int Wp, int OW, int K,
                                                         int S) {
    VECTOR_LOOP for (int ox = 0; ox < OW; ox++) {
        float acc = 0.0f;
        _Pragma("clang loop unroll(full)") for (int i = 0; i < K; i++)
            _Pragma("clang loop unroll(full)") for (int j = 0; j < K; j++)
                acc += taps[i * K + j] * src[i * Wp + ox * S + j];
        dst[ox] = acc;
    }
}

/* one output plane of a depthwise convolution, + b and the activation, row by row (each row
 * stays in L1 while its taps add up). pad: the (Hp, Wp) plane that the taps read, its borders
 * zero (the caller's), its inside filled here with the image. */
static void conv_depthwise(float *plane, const float *img, const float *taps, float b,
                           int activation, float *pad, int H, int W, int kh, int kw, int sh,
                           int sw, int pt, int pl, int dh, int dw, int OH, int OW) {
    int Hp = (OH - 1) * sh + (kh - 1) * dh + 1, Wp = (OW - 1) * sw + (kw - 1) * dw + 1;
    int rows = H < Hp - pt ? H : Hp - pt, cols = W < Wp - pl ? W : Wp - pl;  /* what taps read */
    for (int iy = 0; iy < rows && cols > 0; iy++)
        memcpy(pad + (iy + pt) * Wp + pl, img + iy * W, (size_t)cols * sizeof(float));
    /* 3x3 taps, stride 1 or 2, no dilation: unrolled; 5x5 and 7x7 too on rows shorter than 64
     * (on long rows the taps one by one were up to 2.5x faster: measured on AVX2, the OCR
     * classifier's 96-wide rows) where DW_UNROLL_MAX allows; else the taps one by one */
    int unrolled = kh == 3 || (kh <= DW_UNROLL_MAX && OW < 64);
    int shape = kh == kw && dh == 1 && dw == 1 && sw <= 2 && unrolled ? kh * 2 + sw - 1 : 0;
    for (int oy = 0; oy < OH; oy++) {
        float *dst = plane + oy * OW;
        const float *src = pad + oy * sh * Wp;
        switch (shape) {
        case 6: dw_row(dst, src, taps, Wp, OW, 3, 1); break;
        case 7: dw_row(dst, src, taps, Wp, OW, 3, 2); break;
#if DW_UNROLL_MAX > 3
        case 10: dw_row(dst, src, taps, Wp, OW, 5, 1); break;
        case 11: dw_row(dst, src, taps, Wp, OW, 5, 2); break;
        case 14: dw_row(dst, src, taps, Wp, OW, 7, 1); break;
        case 15: dw_row(dst, src, taps, Wp, OW, 7, 2); break;
#endif
        default:
            for (int ox = 0; ox < OW; ox++) dst[ox] = 0.0f;
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++) {
                    float wv = taps[i * kw + j];
                    const float *__restrict in = src + i * dh * Wp + j * dw;
                    float *__restrict out = dst;
                    if (sw == 1) VECTOR_LOOP for (int ox = 0; ox < OW; ox++) out[ox] += wv * in[ox];
                    else SCALAR_LOOP for (int ox = 0; ox < OW; ox++) out[ox] += wv * in[ox * sw];
                }
        }
        conv_epilogue(dst, OW, b, activation);
    }
}

static void conv_panel(float *scratch, const float *img, int p0, int pn, int cg, int H, int W,
                       int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw, int OW) {
    float *row = scratch;
    for (int c = 0; c < cg; c++, img += H * W)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++, row += pn) {
                int shift = j * dw - pl;  /* ix = ox * sw + shift; [lo, hi): the ox with ix inside */
                int lo = shift >= 0 ? 0 : (-shift + sw - 1) / sw;
                int hi = W - 1 - shift < 0 ? 0 : (W - 1 - shift) / sw + 1;
                if (hi > OW) hi = OW;
                /* the panel's pixels, one output-row segment [a, b) at a time */
                for (int p = p0, q = 0; q < pn;) {
                    int oy = p / OW, a = p % OW, b = OW - a < pn - q ? OW : a + pn - q;
                    float *__restrict dst = row + q - a;
                    int iy = oy * sh - pt + i * dh;
                    if (iy < 0 || iy >= H) {
                        for (int ox = a; ox < b; ox++) dst[ox] = 0.0f;
                    } else {
                        const float *__restrict src = img + iy * W + shift;
                        int from = a > lo ? a : lo, to = b < hi ? b : hi;
                        for (int ox = a; ox < from && ox < b; ox++) dst[ox] = 0.0f;
                        if (sw == 1)
                            for (int ox = from; ox < to; ox++) dst[ox] = src[ox];
                        else
                            for (int ox = from; ox < to; ox++) dst[ox] = src[ox * sw];
                        for (int ox = to > a ? to : a; ox < b; ox++) dst[ox] = 0.0f;
                    }
                    q += b - a;
                    p += b - a;
                }
            }
}

EXPORT(conv2d_f32) void conv2d_f32(float *o, const float *x, const float *w, const float *bias,
                                   float *scratch, const int *g) {
    int N = g[0], C = g[1], H = g[2], W = g[3], O = g[4], kh = g[5], kw = g[6], sh = g[7];
    int sw = g[8], pt = g[9], pl = g[10], dh = g[11], dw = g[12], OH = g[13], OW = g[14];
    int groups = g[15], has_bias = g[16], activation = g[17], panel = g[18];
    int cg = C / groups, og = O / groups, L = OH * OW, K = cg * kh * kw;
    for (int n = 0; n < N; n++) {
        float *out = o + n * O * L;
        if (panel == 0) {
            /* scratch: the zero-padded plane (its borders stay zero: only the inside is written) */
            int Hp = (OH - 1) * sh + (kh - 1) * dh + 1, Wp = (OW - 1) * sw + (kw - 1) * dw + 1;
            if (n == 0) memset(scratch, 0, (size_t)Hp * Wp * sizeof(float));
            for (int oc = 0; oc < O; oc++)
                conv_depthwise(out + oc * L, x + (n * C + oc / og) * H * W, w + oc * kh * kw,
                               has_bias ? bias[oc] : 0.0f, activation, scratch, H, W, kh, kw, sh,
                               sw, pt, pl, dh, dw, OH, OW);
            continue;
        }
        int pointwise = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 &&
                        OH == H && OW == W;  /* the image is its own column matrix */
        for (int grp = 0; grp < groups; grp++)
            if (pointwise)   /* (the output channels shared among the threads) */
                mm_parallel(out + grp * og * L, w + grp * og * K, x + (n * C + grp * cg) * L,
                            1, og, K, L, L, 0, 0, 0, 0);
            else for (int p0 = 0; p0 < L; p0 += panel) {
                int pn = L - p0 < panel ? L - p0 : panel;
                conv_panel(scratch, x + (n * C + grp * cg) * H * W, p0, pn, cg, H, W, kh, kw,
                           sh, sw, pt, pl, dh, dw, OW);
                mm_parallel(out + grp * og * L + p0, w + grp * og * K, scratch, 1, og, K, pn,
                            L, 0, 0, 0, 0);
            }
        for (int oc = 0; oc < O; oc++)
            conv_epilogue(out + oc * L, L, has_bias ? bias[oc] : 0.0f, activation);
    }
}

/* -- conv2d's backward without the im2col matrix (core/backend.py conv2d_backward_kernels) -- */
/* g: conv2d_f32's geometry (has_bias and activation unused); gy (N, O, OH, OW) the output's
 * gradient, x and w as conv2d_f32's, all contiguous. The forward's panel rule: panel 0 (one
 * input channel per group: depthwise) runs direct loops over whole rows, no copy; else `panel`
 * output pixels at a time, their columns (K = C/groups * kh * kw) in `scratch`:
 * - dx: the columns of a panel are the group's transposed weight (K, O/groups) @ the gradient's
 *   panel, folded into dx at once (the adjoint of conv_panel), so no more than one panel of the
 *   column matrix ever exists;
 * - dw: the image's columns of a panel (conv_panel, the forward's gather) times the gradient's
 *   panel transposed (mm_nn's register tiles: the long pixel axis is their reduction) give one
 *   partial product dw^T; with K < 32 (a first layer's few taps) the transpose would
 *   cost as much as the product, so mm_nt takes the dot products along the pixels instead. The
 *   partial products are added to dw in a fixed order (images, then panels): the sums are
 *   float32 and the same on every run. */
#define CONV_GEOMETRY(g)                                                                     \
    int N = g[0], C = g[1], H = g[2], W = g[3], O = g[4], kh = g[5], kw = g[6], sh = g[7];   \
    int sw = g[8], pt = g[9], pl = g[10], dh = g[11], dw = g[12], OH = g[13], OW = g[14];    \
    int groups = g[15], panel = g[18];                                                       \
    int cg = C / groups, og = O / groups, L = OH * OW, K = cg * kh * kw

/* [lo, hi): the output columns ox whose input column ox * sw + shift lies inside the image */
static inline void tap_span(int shift, int sw, int W, int OW, int *lo, int *hi) {
    *lo = shift >= 0 ? 0 : (-shift + sw - 1) / sw;
    *hi = W - 1 - shift < 0 ? 0 : (W - 1 - shift) / sw + 1;
    if (*hi > OW) *hi = OW;
}

static inline float lanes_sum(v128_t v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

/* sum of a[k] * b[k], four lanes then the rest: one fixed order */
static float dot_f32(const float *a, const float *b, int n) {
    v128_t acc = wasm_f32x4_splat(0.0f);
    int k = 0;
    for (; k + 4 <= n; k += 4)
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_v128_load(a + k), wasm_v128_load(b + k)));
    float s = lanes_sum(acc);
    for (; k < n; k++) s += a[k] * b[k];
    return s;
}

/* depthwise dx: plane (H, W) += the taps' weights times grad (OH, OW), scattered back along the
 * forward's reads (conv_direct's adjoint) */
static void conv_direct_dx(float *plane, const float *grad, const float *taps, int H, int W,
                           int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw,
                           int OH, int OW) {
    for (int i = 0; i < kh; i++)
        for (int j = 0; j < kw; j++) {
            float wv = taps[i * kw + j];
            int shift = j * dw - pl, lo, hi;
            tap_span(shift, sw, W, OW, &lo, &hi);
            for (int oy = 0; oy < OH; oy++) {
                int iy = oy * sh - pt + i * dh;
                if (iy < 0 || iy >= H) continue;
                float *__restrict dst = plane + iy * W + shift;
                const float *__restrict src = grad + oy * OW;
                if (sw == 1)
                    VECTOR_LOOP for (int ox = lo; ox < hi; ox++) dst[ox] += wv * src[ox];
                else
                    SCALAR_LOOP for (int ox = lo; ox < hi; ox++) dst[ox * sw] += wv * src[ox];
            }
        }
}

/* depthwise dw of tap (i, j): sum over the output pixels of grad (OH, OW) times the image
 * (H, W) pixel the tap read for it */
static float conv_direct_dw(const float *grad, const float *img, int i, int j, int H, int W,
                            int sh, int sw, int pt, int pl, int dh, int dw, int OH, int OW) {
    int shift = j * dw - pl, lo, hi;
    tap_span(shift, sw, W, OW, &lo, &hi);
    float acc = 0.0f;
    for (int oy = 0; oy < OH; oy++) {
        int iy = oy * sh - pt + i * dh;
        if (iy < 0 || iy >= H || hi <= lo) continue;
        const float *src = img + iy * W + shift, *gr = grad + oy * OW;
        if (sw == 1) {
            acc += dot_f32(gr + lo, src + lo, hi - lo);
        } else {
            float s = 0.0f;
            for (int ox = lo; ox < hi; ox++) s += gr[ox] * src[ox * sw];
            acc += s;
        }
    }
    return acc;
}

/* the panel's columns (cg * kh * kw rows of pn) added into the group's image gradient (cg
 * planes of H, W): conv_panel's adjoint, the same output-row segments */
static void fold_panel(float *img, const float *cols, int p0, int pn, int cg, int H, int W,
                       int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw, int OW) {
    const float *row = cols;
    int oy0 = p0 / OW, a0 = p0 % OW;  /* (segments then advance a row at a time: no divisions) */
    for (int c = 0; c < cg; c++, img += H * W)
        for (int i = 0; i < kh; i++)
            for (int j = 0; j < kw; j++, row += pn) {
                int shift = j * dw - pl, lo, hi;
                tap_span(shift, sw, W, OW, &lo, &hi);
                for (int q = 0, oy = oy0, a = a0; q < pn; oy++, a = 0) {
                    int b = OW - a < pn - q ? OW : a + pn - q;
                    int iy = oy * sh - pt + i * dh;
                    if (iy >= 0 && iy < H) {
                        float *__restrict dst = img + iy * W + shift;
                        const float *__restrict src = row + q - a;
                        int from = a > lo ? a : lo, to = b < hi ? b : hi;
                        if (sw == 1)
                            VECTOR_LOOP for (int ox = from; ox < to; ox++) dst[ox] += src[ox];
                        else
                            SCALAR_LOOP for (int ox = from; ox < to; ox++) dst[ox * sw] += src[ox];
                    }
                    q += b - a;
                }
            }
}

/* rows (rows, L) of the gradient, pixels [p0, p0 + pn) of each, as a (rows, pn) matrix: the
 * rows themselves when the panel is the whole image, else copied into gp */
static const float *grad_panel(float *gp, const float *grad, int rows, int L, int p0, int pn) {
    if (pn == L) return grad;
    for (int r = 0; r < rows; r++) memcpy(gp + r * pn, grad + r * L + p0, (size_t)pn * sizeof(float));
    return gp;
}

/* scratch: the transposed weight (groups, K, O/groups), a column panel K * panel, the
 * gradient's panel (O/groups) * panel */
EXPORT(conv2d_grad_input_f32) void conv2d_grad_input_f32(float *dx, const float *gy,
                                                         const float *w, float *scratch,
                                                         const int *g) {
    CONV_GEOMETRY(g);
    memset(dx, 0, (size_t)N * C * H * W * sizeof(float));
    if (panel == 0) {
        for (int n = 0; n < N; n++)
            for (int oc = 0; oc < O; oc++)
                conv_direct_dx(dx + (n * C + oc / og) * H * W, gy + (n * O + oc) * L,
                               w + oc * kh * kw, H, W, kh, kw, sh, sw, pt, pl, dh, dw, OH, OW);
        return;
    }
    float *wt = scratch, *cols = wt + O * K, *gp = cols + K * panel;
    for (int grp = 0; grp < groups; grp++)
        for (int o = 0; o < og; o++)
            SCALAR_LOOP for (int k = 0; k < K; k++)
                wt[(grp * K + k) * og + o] = w[(grp * og + o) * K + k];
    for (int n = 0; n < N; n++)
        for (int grp = 0; grp < groups; grp++)
            for (int p0 = 0; p0 < L; p0 += panel) {
                int pn = L - p0 < panel ? L - p0 : panel;
                mm_nn(cols, wt + grp * K * og, grad_panel(gp, gy + (n * O + grp * og) * L, og, L,
                      p0, pn), K, og, pn, pn);
                fold_panel(dx + (n * C + grp * cg) * H * W, cols, p0, pn, cg, H, W, kh, kw, sh,
                           sw, pt, pl, dh, dw, OW);
            }
}

/* scratch: a column panel K * panel, the gradient's panel (transposed) (O/groups) * panel, one
 * partial product (K, O/groups) */
EXPORT(conv2d_grad_weight_f32) void conv2d_grad_weight_f32(float *gw, const float *x,
                                                           const float *gy, float *scratch,
                                                           const int *g) {
    CONV_GEOMETRY(g);
    if (panel == 0) {
        for (int oc = 0; oc < O; oc++)
            for (int i = 0; i < kh; i++)
                for (int j = 0; j < kw; j++) {
                    float acc = 0.0f;
                    for (int n = 0; n < N; n++)
                        acc += conv_direct_dw(gy + (n * O + oc) * L, x + (n * C + oc / og) * H * W,
                                              i, j, H, W, sh, sw, pt, pl, dh, dw, OH, OW);
                    gw[(oc * kh + i) * kw + j] = acc;
                }
        return;
    }
    memset(gw, 0, (size_t)O * K * sizeof(float));
    float *cols = scratch, *gt = cols + K * panel, *part = gt + og * panel;
    for (int n = 0; n < N; n++)
        for (int grp = 0; grp < groups; grp++)
            for (int p0 = 0; p0 < L; p0 += panel) {
                int pn = L - p0 < panel ? L - p0 : panel;
                conv_panel(cols, x + (n * C + grp * cg) * H * W, p0, pn, cg, H, W, kh, kw, sh, sw,
                           pt, pl, dh, dw, OW);
                const float *gg = gy + (n * O + grp * og) * L;
                float *dst = gw + grp * og * K;
                if (K < 32) {  /* few taps: dot products along the pixels, nothing to transpose */
                    mm_nt(part, grad_panel(gt, gg, og, L, p0, pn), cols, og, pn, K, K);
                    VECTOR_LOOP for (int e = 0; e < og * K; e++) dst[e] += part[e];
                    continue;
                }
                for (int o = 0; o < og; o++)
                    SCALAR_LOOP for (int p = 0; p < pn; p++) gt[p * og + o] = gg[o * L + p0 + p];
                mm_nn(part, cols, gt, K, pn, og, og);
                for (int k = 0; k < K; k++)
                    SCALAR_LOOP for (int o = 0; o < og; o++) dst[o * K + k] += part[k * og + o];
            }
}

/* dbias (O,): gy (N, O, L) summed over images and pixels, images in order */
EXPORT(conv2d_grad_bias_f32) void conv2d_grad_bias_f32(float *db, const float *gy, int N, int O,
                                                       int L) {
    for (int oc = 0; oc < O; oc++) {
        float acc = 0.0f;
        for (int n = 0; n < N; n++) {
            const float *p = gy + (n * O + oc) * L;
            v128_t s4 = wasm_f32x4_splat(0.0f);
            int k = 0;
            for (; k + 4 <= L; k += 4) s4 = wasm_f32x4_add(s4, wasm_v128_load(p + k));
            float s = lanes_sum(s4);
            for (; k < L; k++) s += p[k];
            acc += s;
        }
        db[oc] = acc;
    }
}

/* -- quantized conv2d: the integer products of matmul_quantized, without an im2col matrix --- */
/* g = [N, C, H, W, O, kh, kw, sh, sw, pt, pl, dh, dw, OH, OW, groups, panel, q_signed, z_code,
 *      z_per_channel, s_per_channel, x_float, has_bias, has_x_zero_point, scaled]
 * (flags, not null pointers: the native build's address 0 is its arena's start)
 * x (N, C, H, W): int32 minus its zero point (*xp, where has_x_zero_point), or (x_float) float32 whose
 * integers are rint(x / *xp) (a QDQ graph's dequantized activation, *xp its scale); q (O,
 * C/groups, kh, kw) the 8-bit weight minus z (z_code as matmul_quantized's: 0 none, 1 int8,
 * 2 uint8, 3 int32; one value or one per output channel). Every difference is an 8-bit
 * value's minus its zero point (|v| <= 255): the image is centred into int16 once, the weight
 * into (O, K2) int16 pairs, and `panel` output pixels at a time have their columns gathered
 * into a (K2, panel, 2) int16 panel that mm_pairs multiplies by the group's weight pairs
 * straight into the output (a last panel of fewer than a multiple of 4 pixels: through
 * `tile`). out (N, O, OH, OW): not scaled, the exact int32 sums (ConvInteger; wrapping as
 * int32 sums do); else float32 sums * xs * s[oc] (+ bias[oc]).
 * scratch (int16): the centred image C*H*W (rounded up to 2), the weight pairs O*2*K2, the
 * panel 2*K2*panel, the tile og*panel int32. */
static void qconv_gather(short *dst, const short *img, int p0, int pn, int H, int W, int i,
                         int j, int sh, int sw, int pt, int pl, int dh, int dw, int OW) {
    int shift = j * dw - pl;  /* as in conv_panel: [lo, hi) reads the image */
    int lo = shift >= 0 ? 0 : (-shift + sw - 1) / sw;
    int hi = W - 1 - shift < 0 ? 0 : (W - 1 - shift) / sw + 1;
    if (hi > OW) hi = OW;
    for (int p = p0, q = 0; q < pn;) {   /* dst's pixel q at dst[2 * q] (one of a pair) */
        int oy = p / OW, a = p % OW, b = OW - a < pn - q ? OW : a + pn - q;
        short *d = dst + 2 * (q - a);
        int iy = oy * sh - pt + i * dh, from = a > lo ? a : lo, to = b < hi ? b : hi;
        if (iy < 0 || iy >= H) from = to = b;
        for (int ox = a; ox < from && ox < b; ox++) d[2 * ox] = 0;
        const short *src = img + iy * W + shift;
        if (sw == 1)
            for (int ox = from; ox < to; ox++) d[2 * ox] = src[ox];
        else
            for (int ox = from; ox < to; ox++) d[2 * ox] = src[ox * sw];
        for (int ox = to > a ? to : a; ox < b; ox++) d[2 * ox] = 0;
        q += b - a;
        p += b - a;
    }
}

EXPORT(conv2d_quantized) void conv2d_quantized(void *o, const void *x, const void *xp,
                                               const void *q, const float *s, const void *z,
                                               const float *bias, short *scratch, const int *g) {
    int N = g[0], C = g[1], H = g[2], W = g[3], O = g[4], kh = g[5], kw = g[6], sh = g[7];
    int sw = g[8], pt = g[9], pl = g[10], dh = g[11], dw = g[12], OH = g[13], OW = g[14];
    int groups = g[15], panel = g[16], q_signed = g[17], z_code = g[18], z_each = g[19];
    int s_each = g[20], x_float = g[21], has_bias = g[22], has_xz = g[23], scaled = g[24];
    int cg = C / groups, og = O / groups, L = OH * OW, K = cg * kh * kw, K2 = (K + 1) / 2;
    int HW = H * W, CHW = C * HW;
    short *img = scratch, *wpairs = img + CHW + (CHW & 1), *pan = wpairs + O * 2 * K2;
    int *tile = (int *)(pan + 2 * K2 * panel);
    for (int oc = 0; oc < O; oc++) {   /* the weight, centred, as (k, k+1) pairs */
        int ze = z_each ? oc : 0;
        int zp = z_code == 3 ? ((const int *)z)[ze] : z_code ? q_at(z, ze, 8, z_code == 1) : 0;
        short *row = wpairs + oc * 2 * K2;
        const signed char *qs = (const signed char *)q + oc * K;
        int mask = q_signed ? -1 : 0xFF;   /* (one loop for int8 and uint8, as fill_pairs) */
        for (int k = 0; k < K; k++) row[k] = (short)((qs[k] & mask) - zp);
        if (K & 1) row[K] = 0;
    }
    float xs = x_float ? *(const float *)xp : 1.0f, inv = 1.0f / xs;
    int xz = has_xz ? *(const int *)xp : 0;
    for (int n = 0; n < N; n++) {
        if (x_float) {
            const float *xf = (const float *)x + n * CHW;
            for (int e = 0; e < CHW; e++) img[e] = (short)(int)__builtin_rintf(xf[e] * inv);
        } else {
            const int *xi = (const int *)x + n * CHW;
            for (int e = 0; e < CHW; e++) img[e] = (short)(xi[e] - xz);
        }
        int *out = (int *)o + n * O * L;
        for (int grp = 0; grp < groups; grp++)
            for (int p0 = 0; p0 < L; p0 += panel) {
                int pn = L - p0 < panel ? L - p0 : panel, pn4 = (pn + 3) & ~3;
                int k = 0;
                for (int c = 0; c < cg; c++)
                    for (int i = 0; i < kh; i++)
                        for (int j = 0; j < kw; j++, k++)
                            qconv_gather(pan + (k >> 1) * 2 * pn4 + (k & 1),
                                         img + (grp * cg + c) * HW, p0, pn, H, W, i, j, sh, sw,
                                         pt, pl, dh, dw, OW);
                if (K & 1)
                    for (int t = 0; t < pn; t++) pan[(K >> 1) * 2 * pn4 + 2 * t + 1] = 0;
                const short *w = wpairs + grp * og * 2 * K2;
                int *dst = out + grp * og * L + p0;
                if (pn4 == pn) {
                    mm_pairs(dst, w, pan, og, K2, pn4, L);
                } else {   /* (the columns past pn hold whatever the panel held: not stored) */
                    mm_pairs(tile, w, pan, og, K2, pn4, pn4);
                    for (int r = 0; r < og; r++)
                        for (int t = 0; t < pn; t++) dst[r * L + t] = tile[r * pn4 + t];
                }
            }
        if (scaled)
            for (int oc = 0; oc < O; oc++) {
                float m = xs * s[s_each ? oc : 0], b = has_bias ? bias[oc] : 0.0f;
                int *acc = out + oc * L;
                float *plane = (float *)acc;
                for (int e = 0; e < L; e++) plane[e] = (float)acc[e] * m + b;
            }
    }
}

/* -- recurrent steps: the lstm_cell and gru_cell primitives of core/backend.py ------------- */
/* One kernel per step of a sequence instead of a dozen elementwise launches. The arithmetic is
 * the reference composition's, in its order (sigmoid(x) = 1 / (1 + exp(-x))). All contiguous. */
static inline float sigmoid_f32(float x) { return 1.0f / (1.0f + expf(-x)); }

/* gates (B, 4H) in ONNX's order i, o, f, g; c (B, H) -> out (2, B, H) = h', c' */
EXPORT(lstm_cell_f32) void lstm_cell_f32(float *out, const float *gates, const float *c, int B,
                                         int H) {
    float *new_c = out + B * H;
    for (int b = 0; b < B; b++, gates += 4 * H, c += H, out += H, new_c += H)
        for (int j = 0; j < H; j++) {
            float i = sigmoid_f32(gates[j]), o = sigmoid_f32(gates[H + j]);
            float f = sigmoid_f32(gates[2 * H + j]);
            float cn = f * c[j] + i * tanhf(gates[3 * H + j]);
            new_c[j] = cn;
            out[j] = o * tanhf(cn);
        }
}

/* gx, gh (B, 3H) in ONNX's order z, r, n; h (B, H) -> out (B, H) = h' (linear_before_reset) */
EXPORT(gru_cell_f32) void gru_cell_f32(float *out, const float *gx, const float *gh, const float *h,
                                       int B, int H) {
    for (int b = 0; b < B; b++, gx += 3 * H, gh += 3 * H, h += H, out += H)
        for (int j = 0; j < H; j++) {
            float z = sigmoid_f32(gx[j] + gh[j]), r = sigmoid_f32(gx[H + j] + gh[H + j]);
            float n = tanhf(gx[2 * H + j] + r * gh[2 * H + j]);
            out[j] = (1.0f - z) * n + z * h[j];
        }
}
