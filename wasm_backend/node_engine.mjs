// cn.Wasm()'s kernels in Node, for a CPython process (engines.NodeEngine) that talks over stdio.
//   node node_engine.mjs cinders-kernels-<hash>.wasm
//   node node_engine.mjs cinders-kernels-threads-<hash>.wasm THREADS path/to/wasm/kernel_threads.mjs
// The second form runs the threaded build on THREADS threads: this one and THREADS - 1 worker
// threads (each runs this script, parked in the kernels' pool).
// One JSON request per stdin line:
//   ["c", name, [int args]]  call an exported kernel    -> reply {"v": result or null}
//   ["w", ptr, base64]       write bytes at ptr         -> no reply (an error goes with the next)
//   ["r", ptr, nbytes]       read bytes                 -> reply {"v": base64}
// The first reply lists the module's exports. A failed request replies {"e": message}.
import fs from "node:fs";
import readline from "node:readline";
import { pathToFileURL } from "node:url";
import { isMainThread, Worker, workerData } from "node:worker_threads";

if (!isMainThread) {
  (await import(workerData.threadsModule)).runWorker(workerData);
}

async function instantiate([path, threads, threadsModule]) {
  const bytes = fs.readFileSync(path);
  const module = new WebAssembly.Module(bytes);
  if (threads === undefined) return new WebAssembly.Instance(module, {}).exports;
  const url = pathToFileURL(threadsModule).href;
  const { importedMemoryPages, startThreaded } = await import(url);
  const spawn = (data) => {
    const worker = new Worker(new URL(import.meta.url), { workerData: { ...data, threadsModule: url } });
    worker.unref();   // parked for good: the process ends with its stdin
    return worker;
  };
  // (Node's main thread may block in Atomics.wait)
  const { instance, memory } = await startThreaded(module, importedMemoryPages(bytes), Number(threads), spawn, true);
  return { ...instance.exports, memory };
}

const exports = isMainThread ? await instantiate(process.argv.slice(2)) : null;
const memory = exports && exports.memory;
let pendingError = null;

function reply(value) {
  const message = pendingError !== null ? { e: pendingError } : { v: value };
  pendingError = null;
  process.stdout.write(JSON.stringify(message) + "\n");
}

function handle([op, a, b]) {
  if (op === "c") {
    const kernel = exports[a];
    if (typeof kernel !== "function") throw new Error(`no kernel named ${a}`);
    const result = kernel(...b);
    reply(result === undefined ? null : result);
  } else if (op === "w") {
    new Uint8Array(memory.buffer).set(Buffer.from(b, "base64"), a);
  } else if (op === "r") {
    reply(Buffer.from(memory.buffer, a, b).toString("base64"));
  } else {
    throw new Error(`unknown request ${op}`);
  }
}

if (isMainThread) {
  reply(Object.keys(exports));
  readline.createInterface({ input: process.stdin }).on("line", (line) => {
    let request;
    try {
      request = JSON.parse(line);
      handle(request);
    } catch (error) {
      if (request && request[0] === "w") pendingError = String(error);
      else { pendingError = String(error); reply(null); }
    }
  });
}
