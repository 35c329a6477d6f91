/* The native build of cn.Wasm()'s kernels: runtime.h and kernels.py's generated C compiled by
 * the host's clang (-O3 -march=native, build.py native_library_path) with this file in front,
 * and called through ctypes (engines.NativeEngine). It gives the names runtime.h takes from
 * WebAssembly, so the tab's module and the desktop's library come from one kernel source:
 *
 * - Linear memory is an arena the engine reserves (arena_reserve): wasm32's 4 GiB of address
 *   space, with 8 GiB of inaccessible guard either side (an int32 element offset of 4-byte
 *   elements reaches +-8 GiB), committed as the heap grows (arena_commit). Addresses stay what
 *   runtime.h's contract says: 32-bit byte offsets, so command words and descriptors are the
 *   same int32s as in the tab; AT(addr) = arena + (uint32_t)addr turns one into a pointer.
 *   A base pointer rather than an arena mapped below 2 GiB (MAP_32BIT) because it works on
 *   every 64-bit POSIX host (macOS and arm64 have no MAP_32BIT), gives each engine an arena of
 *   its own, and costs one add per pointer.
 * - Traps: a kernel that touches an uncommitted or guard page faults; the SIGSEGV/SIGBUS
 *   handler, while a kernel of this library runs on the faulting thread, jumps back to the
 *   entry (native_run, native_indexed), which reports it (the engine raises WasmEngineError,
 *   as Wasmtime does on a trap); any other fault goes to the handler installed before ours.
 * - SIMD128: the few wasm_* intrinsics runtime.h uses, as clang vector extensions (SSE/AVX on
 *   x86-64, NEON on arm64); plain loops are vectorised by the compiler for the host's width.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define EXPORT(name) __attribute__((visibility("default"), noinline))
/* runtime.h's loop hints keep the tab's module small; here the compiler's own choices (it
 * versions strided loops for unit strides, unrolls and interleaves) */
#define SCALAR_LOOP
#define VECTOR_LOOP
#define AT(addr) ((void *)(arena + (uint32_t)(addr)))

/* the arena of the entry running on this thread, and where a fault in a kernel jumps to
 * (initial-exec: read in the fault handler; volatile: only the handler reads it, which the
 * compiler cannot see, so it would drop the store) */
static __thread unsigned char *arena __attribute__((tls_model("initial-exec")));
static __thread sigjmp_buf *volatile trap_exit __attribute__((tls_model("initial-exec")));

/* -- WebAssembly's float min/max: NaN if either is NaN, -0 < +0 ---------------------------- */
static inline float max_f32(float a, float b) {
    if (a != a || b != b) return a + b;
    if (a == b) return __builtin_signbit(a) ? b : a;
    return a > b ? a : b;
}
static inline float min_f32(float a, float b) {
    if (a != a || b != b) return a + b;
    if (a == b) return __builtin_signbit(a) ? a : b;
    return a < b ? a : b;
}

/* -- SIMD128 as vector extensions: v128_t is 16 opaque bytes, as in wasm_simd128.h --------- */
typedef int32_t v128_t __attribute__((vector_size(16)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef int16_t i16x8 __attribute__((vector_size(16)));
typedef int32_t i32x8 __attribute__((vector_size(32)));

static inline v128_t wasm_v128_load(const void *p) { v128_t v; memcpy(&v, p, 16); return v; }
static inline void wasm_v128_store(void *p, v128_t v) { memcpy(p, &v, 16); }
static inline v128_t wasm_f32x4_splat(float x) { return (v128_t)(f32x4){x, x, x, x}; }
static inline v128_t wasm_f32x4_add(v128_t a, v128_t b) { return (v128_t)((f32x4)a + (f32x4)b); }
static inline v128_t wasm_f32x4_mul(v128_t a, v128_t b) { return (v128_t)((f32x4)a * (f32x4)b); }
#define wasm_f32x4_extract_lane(v, i) (((f32x4)(v))[i])
static inline v128_t wasm_i32x4_splat(int32_t x) { return (v128_t){x, x, x, x}; }
static inline v128_t wasm_i32x4_add(v128_t a, v128_t b) {
    return (v128_t)((uint32_t __attribute__((vector_size(16))))a +
                    (uint32_t __attribute__((vector_size(16))))b);
}
#ifdef __SSE2__   /* pmaddwd is i32x4.dot_i16x8_s */
static inline v128_t wasm_i32x4_dot_i16x8(v128_t a, v128_t b) {
    return (v128_t)__builtin_ia32_pmaddwd128((i16x8)a, (i16x8)b);
}
#else
static inline v128_t wasm_i32x4_dot_i16x8(v128_t a, v128_t b) {
    i32x8 p = __builtin_convertvector((i16x8)a, i32x8) * __builtin_convertvector((i16x8)b, i32x8);
    return __builtin_shufflevector(p, p, 0, 2, 4, 6) + __builtin_shufflevector(p, p, 1, 3, 5, 7);
}
#endif
static inline v128_t wasm_f32x4_div(v128_t a, v128_t b) { return (v128_t)((f32x4)a / (f32x4)b); }
/* with WebAssembly's rules, on whole vectors (branch-free lane masks): min/max propagate NaN
 * (as a + b does) and order -0 < +0 (equal lanes: the AND / OR of their bits), nearest rounds
 * half to even, trunc_sat saturates (NaN -> 0) */
static inline v128_t wasm_f32x4_max(v128_t a, v128_t b) {
    f32x4 x = (f32x4)a, y = (f32x4)b;
    v128_t gt = (v128_t)(x > y), lt = (v128_t)(x < y), eq = (v128_t)(x == y);
    return (gt & a) | (lt & b) | (eq & a & b) | (~(gt | lt | eq) & (v128_t)(x + y));
}
static inline v128_t wasm_f32x4_min(v128_t a, v128_t b) {
    f32x4 x = (f32x4)a, y = (f32x4)b;
    v128_t gt = (v128_t)(x > y), lt = (v128_t)(x < y), eq = (v128_t)(x == y);
    return (lt & a) | (gt & b) | (eq & (a | b)) | (~(gt | lt | eq) & (v128_t)(x + y));
}
/* pmin/pmax: WebAssembly's pseudo-minimum b < a ? b : a and pseudo-maximum a < b ? b : a
 * (no NaN rule: a NaN compares false and the other operand's lane is kept as written) */
static inline v128_t wasm_f32x4_pmin(v128_t a, v128_t b) {
    v128_t take_b = (v128_t)((f32x4)b < (f32x4)a);
    return (take_b & b) | (~take_b & a);
}
static inline v128_t wasm_f32x4_pmax(v128_t a, v128_t b) {
    v128_t take_b = (v128_t)((f32x4)a < (f32x4)b);
    return (take_b & b) | (~take_b & a);
}
static inline v128_t wasm_i32x4_min(v128_t a, v128_t b) { return __builtin_elementwise_min(a, b); }
static inline v128_t wasm_i32x4_max(v128_t a, v128_t b) { return __builtin_elementwise_max(a, b); }
static inline v128_t wasm_i32x4_lt(v128_t a, v128_t b) { return (v128_t)(a < b); }
static inline v128_t wasm_i32x4_gt(v128_t a, v128_t b) { return (v128_t)(a > b); }
static inline v128_t wasm_f32x4_ne(v128_t a, v128_t b) { return (v128_t)((f32x4)a != (f32x4)b); }
static inline v128_t wasm_v128_or(v128_t a, v128_t b) { return a | b; }
static inline int wasm_v128_any_true(v128_t a) { return (a[0] | a[1] | a[2] | a[3]) != 0; }
static inline v128_t wasm_f32x4_nearest(v128_t a) {
    return (v128_t)__builtin_elementwise_roundeven((f32x4)a);
}
static inline v128_t wasm_i32x4_trunc_sat_f32x4(v128_t a) {
    f32x4 x = (f32x4)a;
    v128_t high = (v128_t)(x >= 2147483648.0f), low = (v128_t)(x <= -2147483648.0f);
    v128_t inside = (v128_t)(x > -2147483648.0f) & (v128_t)(x < 2147483648.0f);   /* (NaN: none) */
    v128_t r = __builtin_convertvector((f32x4)(a & inside), v128_t) & inside;
    return r | (high & INT32_MAX) | (low & INT32_MIN);
}
static inline v128_t wasm_i16x8_narrow_i32x4(v128_t a, v128_t b) {
    i16x8 r;
    for (int l = 0; l < 8; l++) {
        int32_t v = l < 4 ? a[l] : b[l - 4];
        r[l] = (int16_t)(v > INT16_MAX ? INT16_MAX : v < INT16_MIN ? INT16_MIN : v);
    }
    return (v128_t)r;
}
static inline v128_t wasm_i16x8_load8x8(const void *p) {
    int8_t __attribute__((vector_size(8))) v; memcpy(&v, p, 8);
    return (v128_t)__builtin_convertvector(v, i16x8);
}
static inline v128_t wasm_u16x8_load8x8(const void *p) {
    uint8_t __attribute__((vector_size(8))) v; memcpy(&v, p, 8);
    return (v128_t)__builtin_convertvector(v, i16x8);
}
static inline v128_t wasm_i16x8_sub(v128_t a, v128_t b) {
    return (v128_t)((uint16_t __attribute__((vector_size(16))))a -
                    (uint16_t __attribute__((vector_size(16))))b);
}
#define wasm_i16x8_shuffle(a, b, ...) \
    ((v128_t)__builtin_shufflevector((i16x8)(a), (i16x8)(b), __VA_ARGS__))

/* -- matmul at the host's vector width -------------------------------------------------------
 * runtime.h's mm_nn and mm_nt hold their tiles in SIMD128 registers (the tab's ISA); here the
 * same register-blocked products on 8-float vectors (one AVX register on x86-64, two NEON or
 * SSE ones elsewhere), whose a + x * y the compiler fuses into FMAs. Same signatures and
 * results up to rounding; conv2d, matmul_f32 and matmul_quantized call these instead. */
#define NATIVE_MATMUL
typedef float f32x8 __attribute__((vector_size(32)));

static inline f32x8 load8(const float *p) { f32x8 v; memcpy(&v, p, 32); return v; }
static inline void store8(float *p, f32x8 v) { memcpy(p, &v, 32); }
static inline f32x8 splat8(float x) { return (f32x8){x, x, x, x, x, x, x, x}; }
/* the tiles' k loops stay rolled: unrolled, their accumulators no longer fit the registers */
#define K_LOOP _Pragma("clang loop unroll(disable) interleave_count(1) vectorize(disable)")
static inline float hsum8(f32x8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* R rows of o (rows ldo apart) = a (R, K) @ b (K, N): 16, then 8, then 4 columns per tile held
 * in 2R (R) vector registers, each step broadcasting one a value per row */
#define MM_NN_ROWS(R)                                                                        \
    static void mm_nn_##R(float *o, const float *a, const float *b, int K, int N, int ldo) { \
        int j = 0;                                                                           \
        for (; j + 16 <= N; j += 16) {                                                       \
            f32x8 c0[R], c1[R];                                                              \
            for (int r = 0; r < R; r++) c0[r] = c1[r] = splat8(0.0f);                        \
            const float *bk = b + j;                                                         \
            K_LOOP for (int k = 0; k < K; k++, bk += N) {                                    \
                f32x8 b0 = load8(bk), b1 = load8(bk + 8);                                    \
                for (int r = 0; r < R; r++) {                                                \
                    f32x8 x = splat8(a[r * K + k]);                                          \
                    c0[r] += x * b0;                                                         \
                    c1[r] += x * b1;                                                         \
                }                                                                            \
            }                                                                                \
            for (int r = 0; r < R; r++) {                                                    \
                store8(o + r * ldo + j, c0[r]);                                              \
                store8(o + r * ldo + j + 8, c1[r]);                                          \
            }                                                                                \
        }                                                                                    \
        for (; j + 8 <= N; j += 8) {                                                         \
            f32x8 c[R];                                                                      \
            for (int r = 0; r < R; r++) c[r] = splat8(0.0f);                                 \
            const float *bk = b + j;                                                         \
            K_LOOP for (int k = 0; k < K; k++, bk += N) {                                    \
                f32x8 b0 = load8(bk);                                                        \
                for (int r = 0; r < R; r++) c[r] += splat8(a[r * K + k]) * b0;               \
            }                                                                                \
            for (int r = 0; r < R; r++) store8(o + r * ldo + j, c[r]);                       \
        }                                                                                    \
        for (; j + 4 <= N; j += 4) {  /* (a convolution of a 2x2 image: 4 columns in all) */ \
            f32x4 c[R];                                                                      \
            for (int r = 0; r < R; r++) c[r] = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};              \
            const float *bk = b + j;                                                         \
            K_LOOP for (int k = 0; k < K; k++, bk += N) {                                    \
                f32x4 b0;                                                                    \
                memcpy(&b0, bk, 16);                                                         \
                for (int r = 0; r < R; r++) c[r] += a[r * K + k] * b0;                       \
            }                                                                                \
            for (int r = 0; r < R; r++) memcpy(o + r * ldo + j, &c[r], 16);                  \
        }                                                                                    \
        if (j < N) {  /* the last 1-3 columns: a 4-column tile over zero-padded b values */  \
            int t = N - j;                                                                   \
            f32x4 c[R];                                                                      \
            for (int r = 0; r < R; r++) c[r] = (f32x4){0.0f, 0.0f, 0.0f, 0.0f};              \
            const float *bk = b + j;                                                         \
            K_LOOP for (int k = 0; k < K; k++, bk += N) {                                    \
                f32x4 b0 = {bk[0], t > 1 ? bk[1] : 0.0f, t > 2 ? bk[2] : 0.0f, 0.0f};        \
                for (int r = 0; r < R; r++) c[r] += a[r * K + k] * b0;                       \
            }                                                                                \
            for (int r = 0; r < R; r++)                                                      \
                for (int q = 0; q < t; q++) o[r * ldo + j + q] = c[r][q];                    \
        }                                                                                    \
    }
MM_NN_ROWS(6)
MM_NN_ROWS(4)
MM_NN_ROWS(2)
MM_NN_ROWS(1)

/* o (M, N) = a (M, K) @ b (K, N), all row-major (o's rows ldo apart): six rows at a time (12
 * accumulators, 2 b vectors and a broadcast fill 15 of the 16 AVX registers) */
static void mm_nn(float *o, const float *a, const float *b, int M, int K, int N, int ldo) {
    int i = 0;
    for (; i + 6 <= M; i += 6) mm_nn_6(o + i * ldo, a + i * K, b, K, N, ldo);
    if (i + 4 <= M) { mm_nn_4(o + i * ldo, a + i * K, b, K, N, ldo); i += 4; }
    if (i + 2 <= M) { mm_nn_2(o + i * ldo, a + i * K, b, K, N, ldo); i += 2; }
    if (i < M) mm_nn_1(o + i * ldo, a + i * K, b, K, N, ldo);
}

/* o (M, N) = a (M, K) @ bt (N, K)^T: dot products along contiguous K (Linear's x @ W.T), two a
 * rows against four bt rows at a time (each bt load serves both rows) */
#define MM_NT_ROWS(R)                                                                        \
    static void mm_nt_##R(float *o, const float *a, const float *bt, int K, int N, int ldo) {\
        int k8 = K & ~7, j = 0;                                                              \
        for (; j + 4 <= N; j += 4) {                                                         \
            f32x8 c[R][4];                                                                   \
            for (int r = 0; r < R; r++) c[r][0] = c[r][1] = c[r][2] = c[r][3] = splat8(0.0f);\
            K_LOOP for (int k = 0; k < k8; k += 8)                                           \
                for (int q = 0; q < 4; q++) {                                                \
                    f32x8 y = load8(bt + (j + q) * K + k);                                   \
                    for (int r = 0; r < R; r++) c[r][q] += load8(a + r * K + k) * y;         \
                }                                                                            \
            for (int r = 0; r < R; r++)                                                      \
                for (int q = 0; q < 4; q++) {                                                \
                    float s = hsum8(c[r][q]);                                                \
                    for (int k = k8; k < K; k++) s += a[r * K + k] * bt[(j + q) * K + k];    \
                    o[r * ldo + j + q] = s;                                                  \
                }                                                                            \
        }                                                                                    \
        for (; j < N; j++)                                                                   \
            for (int r = 0; r < R; r++) {                                                    \
                f32x8 c = splat8(0.0f);                                                      \
                for (int k = 0; k < k8; k += 8) c += load8(a + r * K + k) * load8(bt + j * K + k); \
                float s = hsum8(c);                                                          \
                for (int k = k8; k < K; k++) s += a[r * K + k] * bt[j * K + k];              \
                o[r * ldo + j] = s;                                                          \
            }                                                                                \
    }
MM_NT_ROWS(2)
MM_NT_ROWS(1)

static void mm_nt(float *o, const float *a, const float *bt, int M, int K, int N, int ldo) {
    int i = 0;
    for (; i + 2 <= M; i += 2) mm_nt_2(o + i * ldo, a + i * K, bt, K, N, ldo);
    if (i < M) mm_nt_1(o + i * ldo, a + i * K, bt, K, N, ldo);
}

/* -- the arena ------------------------------------------------------------------------------ */
#define ARENA_BYTES (1ull << 32)
#define GUARD_BYTES (8ull << 30)

static struct sigaction previous_segv, previous_bus;

static void on_fault(int sig, siginfo_t *info, void *context) {
    sigjmp_buf *trap = trap_exit;
    if (trap) {
        trap_exit = 0;
        siglongjmp(*trap, 1);
    }
    struct sigaction *previous = sig == SIGSEGV ? &previous_segv : &previous_bus;
    if (previous->sa_flags & SA_SIGINFO)
        previous->sa_sigaction(sig, info, context);
    else if (previous->sa_handler != SIG_DFL && previous->sa_handler != SIG_IGN)
        previous->sa_handler(sig);
    else
        sigaction(sig, previous, 0);  /* returning re-runs the access: the default action */
}

EXPORT(arena_reserve) unsigned char *arena_reserve(void) {
    static int handler_installed;
    unsigned char *p = mmap(0, ARENA_BYTES + 2 * GUARD_BYTES, PROT_NONE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return 0;
    if (!handler_installed) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(SIGSEGV, &action, &previous_segv);
        sigaction(SIGBUS, &action, &previous_bus);
        handler_installed = 1;
    }
    return p + GUARD_BYTES;
}

/* the first `bytes` of the arena readable and writable (the memory's size after a grow) */
EXPORT(arena_commit) int arena_commit(unsigned char *base, size_t bytes) {
    return mprotect(base, bytes, PROT_READ | PROT_WRITE);
}

EXPORT(arena_release) void arena_release(unsigned char *base) {
    munmap(base - GUARD_BYTES, ARENA_BYTES + 2 * GUARD_BYTES);
}

/* -- the integer product at the host's vector width ------------------------------------------
 * runtime.h's mm_pairs on 256-bit vectors where the CPU has AVX2: vpmaddwd multiplies 16 int16
 * pairs and adds them two by two into 8 int32 lanes (i32x4.dot_i16x8_s twice over; sums wrap),
 * six rows by 16 columns per tile (12 accumulators, 2 panel vectors, a broadcast). Same
 * signature and (exact) results. */
#ifdef __AVX2__
#define NATIVE_PAIRS
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
static inline i16x16 load16x16(const short *p) { i16x16 v; memcpy(&v, p, 32); return v; }
static inline u32x8 dot16x16(int32_t pair, i16x16 b) {
    i32x8 x = {pair, pair, pair, pair, pair, pair, pair, pair};
    return (u32x8)__builtin_ia32_pmaddwd256((i16x16)x, b);
}
#define MM_PAIRS_ROWS(R)                                                                     \
    static void mm_pairs_##R(int *o, const int *a, const short *b, int K2, int N, int ldo) { \
        int j = 0;                                                                           \
        for (; j + 16 <= N; j += 16) {                                                       \
            u32x8 c0[R], c1[R];                                                              \
            for (int r = 0; r < R; r++) c0[r] = c1[r] = (u32x8){0};                          \
            const short *bk = b + 2 * j;                                                     \
            K_LOOP for (int k = 0; k < K2; k++, bk += 2 * N) {                               \
                i16x16 b0 = load16x16(bk), b1 = load16x16(bk + 16);                          \
                for (int r = 0; r < R; r++) {                                                \
                    c0[r] += dot16x16(a[r * K2 + k], b0);                                    \
                    c1[r] += dot16x16(a[r * K2 + k], b1);                                    \
                }                                                                            \
            }                                                                                \
            for (int r = 0; r < R; r++) {                                                    \
                memcpy(o + r * ldo + j, &c0[r], 32);                                         \
                memcpy(o + r * ldo + j + 8, &c1[r], 32);                                     \
            }                                                                                \
        }                                                                                    \
        for (; j + 8 <= N; j += 8) {                                                         \
            u32x8 c[R];                                                                      \
            for (int r = 0; r < R; r++) c[r] = (u32x8){0};                                   \
            const short *bk = b + 2 * j;                                                     \
            K_LOOP for (int k = 0; k < K2; k++, bk += 2 * N) {                               \
                i16x16 b0 = load16x16(bk);                                                   \
                for (int r = 0; r < R; r++) c[r] += dot16x16(a[r * K2 + k], b0);             \
            }                                                                                \
            for (int r = 0; r < R; r++) memcpy(o + r * ldo + j, &c[r], 32);                  \
        }                                                                                    \
        for (; j < N; j += 4) {   /* (N % 4 == 0: the last 4 columns, 128 bits) */            \
            v128_t c[R];                                                                     \
            for (int r = 0; r < R; r++) c[r] = wasm_i32x4_splat(0);                          \
            const short *bk = b + 2 * j;                                                     \
            K_LOOP for (int k = 0; k < K2; k++, bk += 2 * N) {                               \
                v128_t b0 = wasm_v128_load(bk);                                              \
                for (int r = 0; r < R; r++)                                                  \
                    c[r] = wasm_i32x4_add(c[r], wasm_i32x4_dot_i16x8(wasm_i32x4_splat(a[r * K2 + k]), b0)); \
            }                                                                                \
            for (int r = 0; r < R; r++) wasm_v128_store(o + r * ldo + j, c[r]);              \
        }                                                                                    \
    }
MM_PAIRS_ROWS(6)
MM_PAIRS_ROWS(4)
MM_PAIRS_ROWS(2)
MM_PAIRS_ROWS(1)

/* o (M, nn) int32 (rows ldo apart) = a16 (M, 2 * K2) @ the (K2, nn, 2) panel; nn % 4 == 0 */
static void mm_pairs(int *o, const short *a16, const short *panel, int M, int K2, int nn,
                     int ldo) {
    const int *a = (const int *)a16;   /* (k, k+1) pairs as one int32 each */
    int i = 0;
    for (; i + 6 <= M; i += 6) mm_pairs_6(o + i * ldo, a + i * K2, panel, K2, nn, ldo);
    if (i + 4 <= M) { mm_pairs_4(o + i * ldo, a + i * K2, panel, K2, nn, ldo); i += 4; }
    if (i + 2 <= M) { mm_pairs_2(o + i * ldo, a + i * K2, panel, K2, nn, ldo); i += 2; }
    if (i < M) mm_pairs_1(o + i * ldo, a + i * K2, panel, K2, nn, ldo);
}
#endif

/* -- entries: every kernel runs under one of these (the arena set, traps caught) ---------- */
void run_commands(const int *c, int n);

/* run the commands at c (a pointer: into the arena, or the engine's own array for a single
 * call); 0, or -1 when a kernel trapped */
EXPORT(native_run) int native_run(unsigned char *base, const int *c, int n) {
    sigjmp_buf trap;
    arena = base;
    if (sigsetjmp(trap, 1)) return -1;
    trap_exit = &trap;
    run_commands(c, n);
    trap_exit = 0;
    return 0;
}

/* a gather_* or scatter_add_* kernel (runtime.h GATHER, SCATTER_ADD: one signature), its
 * pointers given as addresses; its result, or INT_MIN when it trapped */
typedef int (*indexed_kernel)(const int *, void *, const void *, const int *, int, int);
EXPORT(native_indexed) int native_indexed(unsigned char *base, void *kernel, int d, int o, int x,
                                          int i, int size, int axis_stride) {
    sigjmp_buf trap;
    arena = base;
    if (sigsetjmp(trap, 1)) return INT32_MIN;
    trap_exit = &trap;
    int result = ((indexed_kernel)kernel)(AT(d), AT(o), AT(x), AT(i), size, axis_stride);
    trap_exit = 0;
    return result;
}
