// The threaded build of cn.Wasm()'s kernels (wasm_backend/build.py, runtime.h parallel_for): one
// instance on the calling thread and one in each of threads - 1 workers (Web Workers in a page,
// worker threads in Node), all on one shared memory; each worker parks in pool_worker and takes
// a share of every matmul and convolution the calling thread starts. Used by wasm/cinders.js
// (pages) and wasm_backend/node_engine.mjs (the test suite's Node engine).

export const THREADS_MAX = 8;        // build.py THREADS_MAX (runtime.h POOL_THREADS)
export const DEFAULT_THREADS_CAP = 4;

// How many threads to run: `requested` when given (1 = the single-threaded module), else the
// machine's cores up to DEFAULT_THREADS_CAP; never more than the build's THREADS_MAX.
export function threadCount(requested, cores) {
  const wanted = requested ?? Math.min(cores || 1, DEFAULT_THREADS_CAP);
  if (!Number.isInteger(wanted) || wanted < 1) throw new RangeError(`cinders: threads must be a whole number >= 1, got ${requested}`);
  return Math.min(wanted, THREADS_MAX);
}

// The initial size, in 64 KiB pages, of the memory a module imports (its import section's
// limits): the shared memory is made that big, and grows as the heap needs.
export function importedMemoryPages(bytes) {
  const data = new Uint8Array(bytes);
  let at = 8;
  const leb = () => {
    let value = 0, shift = 0, byte;
    do { byte = data[at++]; value += (byte & 0x7f) * 2 ** shift; shift += 7; } while (byte & 0x80);
    return value;
  };
  while (at < data.length) {
    const id = data[at++], size = leb(), end = at + size;
    if (id === 2) {
      for (let n = leb(); n > 0; n--) {
        for (let names = 0; names < 2; names++) { const length = leb(); at += length; }   // module, field
        const kind = data[at++];
        if (kind === 2) { at++; return leb(); }                // memory: flags, initial, max
        throw new Error("cinders: the threaded kernels import something other than their memory");
      }
    }
    at = end;
  }
  throw new Error("cinders: the threaded kernels import no memory (not a threaded build)");
}

// The calling thread's side: the shared memory, this thread's instance and threads - 1 workers
// made by spawn({module, memory, worker}) (worker: 1 .. threads - 1). Resolves once every worker
// is parked (runtime.h pool_worker; a job never waits for a worker that has not joined it) to
// {instance, memory, workers, threads}.
// callerWaits: this thread may block in Atomics.wait (a worker, Node), else (a page's main thread)
// it spins for the workers' last items.
export async function startThreaded(module, pages, threads, spawn, callerWaits, timeoutMs = 30000) {
  const memory = new WebAssembly.Memory({ initial: pages, maximum: 65536, shared: true });
  const instance = await WebAssembly.instantiate(module, { env: { memory } });
  instance.exports.pool_set_caller_waits(callerWaits ? 1 : 0);
  const workers = [];
  for (let worker = 1; worker < threads; worker++) workers.push(spawn({ module, memory, worker }));
  const t0 = Date.now();
  while (instance.exports.pool_threads() < threads) {
    if (Date.now() - t0 > timeoutMs) {
      throw new Error(`cinders: only ${instance.exports.pool_threads()} of ${threads} kernel threads started`);
    }
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
  return { instance, memory, workers, threads };
}

// A worker's side: its own instance on the shared memory, on its own stack, parked for good.
export function runWorker({ module, memory, worker }) {
  const { exports } = new WebAssembly.Instance(module, { env: { memory } });
  exports.__stack_pointer.value = exports.pool_stack_top(worker);
  exports.pool_worker();   // never returns
}
