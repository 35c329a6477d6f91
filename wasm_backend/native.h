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
static inline v128_t wasm_i32x4_dot_i16x8(v128_t a, v128_t b) {
    i32x8 p = __builtin_convertvector((i16x8)a, i32x8) * __builtin_convertvector((i16x8)b, i32x8);
    return __builtin_shufflevector(p, p, 0, 2, 4, 6) + __builtin_shufflevector(p, p, 1, 3, 5, 7);
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
