// cn.Wasm()'s kernels for MicroPython WebAssembly (the /mnist-micro/ page): the board runtime's
// `wasm` engine (micro/runtime/cinders/_wasm.py) finds them as `js.cindersKernels`.
//
//   import { loadMicroKernels } from "/wasm/micro_kernels.mjs";
//   await loadMicroKernels();          // before MicroPython imports cinders
//
// MicroPython's `js` module hands Python buffers to JS as proxies, not typed arrays, and reading
// a typed array from Python goes element by element; strings cross in one piece. So bytes
// travel as base64 both ways (binascii on the Python side and atob/btoa here: native code on
// both). Weights are uploaded once; a layer is then one call: linear(x_b64, weights, bias,
// n_in, n_out) runs the module's matmul (four-row SIMD dot products), adds the bias and
// returns y as base64.
const DEFAULT_URL = new URL("../wasm-kernels/cinders-kernels.wasm", import.meta.url).href;

function decodeBase64(text, into) {
  const binary = atob(text.replace(/\n/g, ""));
  for (let i = 0; i < binary.length; i++) into[i] = binary.charCodeAt(i);
  return binary.length;
}

function encodeBase64(bytes) {
  let binary = "";
  for (let i = 0; i < bytes.length; i += 4096) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 4096));
  return btoa(binary);
}

export async function loadMicroKernels(url = DEFAULT_URL) {
  const { instance } = await WebAssembly.instantiateStreaming(fetch(url), {});
  return installMicroKernels(instance);
}

// (Node tests instantiate the module from a file and install it with this.)
export function installMicroKernels(instance) {
  const k = instance.exports;
  let top = (k.heap_base() + 15) & ~15;
  const alloc = (nbytes) => {
    const ptr = top;
    top += (nbytes + 15) & ~15;
    const need = top - k.memory.buffer.byteLength;
    if (need > 0 && k.memory_grow(Math.ceil(need / 65536)) < 0) throw new Error("cinders: wasm memory full");
    return ptr;
  };
  let scratch = { ptr: 0, bytes: 0 };
  const scratchOf = (nbytes) => {  // input and output of one layer, reused
    if (scratch.bytes < nbytes) scratch = { ptr: alloc(nbytes), bytes: nbytes };
    return scratch.ptr;
  };
  globalThis.cindersKernels = {
    // float32 bytes (base64) -> address of a permanent copy in the module's memory
    upload(b64, nbytes) {
      const ptr = alloc(nbytes);
      decodeBase64(b64, new Uint8Array(k.memory.buffer, ptr, nbytes));
      return ptr;
    },
    // y = W x + b for W (n_out, n_in) at w, b (n_out floats) at bias (0: none); y as base64
    linear(xB64, w, bias, nIn, nOut) {
      const x = scratchOf(4 * (nIn + nOut)), y = x + 4 * nIn;
      decodeBase64(xB64, new Uint8Array(k.memory.buffer, x, 4 * nIn));
      k.matmul_f32(y, x, w, 1, 1, nIn, nOut, 0, 0, 1);
      const out = new Float32Array(k.memory.buffer, y, nOut);
      if (bias) {
        const b = new Float32Array(k.memory.buffer, bias, nOut);
        for (let j = 0; j < nOut; j++) out[j] += b[j];
      }
      return encodeBase64(new Uint8Array(k.memory.buffer, y, 4 * nOut));
    },
  };
  return globalThis.cindersKernels;
}
