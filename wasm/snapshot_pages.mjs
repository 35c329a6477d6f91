// The Pyodide memory snapshot as the server stores and sends it: only its pages that hold a
// nonzero byte. Half of the 31 MB memory is zero pages; the browser decodes (brotli) only what is
// sent, and decoding was the network service's biggest task of a cold start (Python's brotli on
// the test machine at load 8: 0.32-0.39 s of one core for the full memory, 0.17 s for its pages).
// precompile.mjs writes the file, cinders.js restores it into a zeroed buffer of the memory's size.
//
// Layout (little-endian uint32 words, then bytes):
//   MAGIC, memory bytes, PAGE_BYTES, runs, then per run: first page, pages;
//   then the runs' bytes, one after another (the memory's last page may be short).

const MAGIC = 0x50534e43;    // "CNSP"
export const PAGE_BYTES = 4096;

// memory (Uint8Array) -> the file's bytes (Uint8Array).
export function dropZeroPages(memory) {
  const pages = Math.ceil(memory.length / PAGE_BYTES);
  const zero = (page) => {
    for (let at = page * PAGE_BYTES, end = Math.min(at + PAGE_BYTES, memory.length); at < end; at++) {
      if (memory[at] !== 0) return false;
    }
    return true;
  };
  const runs = [];
  for (let page = 0; page < pages; page++) {
    if (zero(page)) continue;
    const last = runs[runs.length - 1];
    if (last && last[0] + last[1] === page) last[1]++;
    else runs.push([page, 1]);
  }
  const header = 4 + 2 * runs.length;
  const spans = runs.map(([first, count]) => [first * PAGE_BYTES, Math.min((first + count) * PAGE_BYTES, memory.length)]);
  const file = new Uint8Array(4 * header + spans.reduce((total, [start, end]) => total + end - start, 0));
  const words = new DataView(file.buffer);
  [MAGIC, memory.length, PAGE_BYTES, runs.length, ...runs.flat()].forEach((word, i) => words.setUint32(4 * i, word, true));
  let at = 4 * header;
  for (const [start, end] of spans) {
    file.set(memory.subarray(start, end), at);
    at += end - start;
  }
  return file;
}

// The file's bytes (ArrayBuffer) written into target (a zeroed Uint8Array of the memory's size).
export function restoreZeroPages(file, target) {
  const words = new DataView(file);
  const word = (i) => words.getUint32(4 * i, true);
  if (file.byteLength < 16 || word(0) !== MAGIC || word(2) !== PAGE_BYTES) {
    throw new Error("not a cinders snapshot (its header is missing: rebuild the wheel)");
  }
  if (word(1) !== target.length) throw new Error(`the snapshot restores ${word(1)} bytes, the manifest says ${target.length}`);
  const runs = word(3);
  const bytes = new Uint8Array(file);
  let at = 16 + 8 * runs, written = 0;
  if (at > bytes.length) throw new Error("the snapshot is truncated or corrupt");
  for (let run = 0; run < runs; run++) {
    const start = word(4 + 2 * run) * PAGE_BYTES;
    const end = Math.min(start + word(5 + 2 * run) * PAGE_BYTES, target.length);
    // (runs ascend without overlapping, as dropZeroPages writes them)
    if (start < written || end <= start || at + end - start > bytes.length) {
      throw new Error("the snapshot is truncated or corrupt");
    }
    written = end;
    target.set(bytes.subarray(at, at + end - start), start);
    at += end - start;
  }
  if (at !== bytes.length) throw new Error("the snapshot is truncated or corrupt");
}
