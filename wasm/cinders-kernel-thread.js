// One worker of cn.Wasm()'s threaded kernels in a page (kernel_threads.mjs startThreaded spawns
// it): the first message {module, memory, worker} parks it in the kernels' pool for good.
import { runWorker } from "./kernel_threads.mjs";

self.onmessage = ({ data }) => runWorker(data);
