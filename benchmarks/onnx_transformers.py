"""Transformers from `transformers` configs (random weights, no downloads), exported to ONNX by
torch.onnx.export and imported by cinders.onnx, side by side in one run with PyTorch on the same
device and with onnxruntime on the CPU.

One JSON line per (model, batch, stack):
    {"bench": "transformers", "model", "batch", "seq", "stack", "cinders_ms", "reference",
     "reference_ms", "ratio", "replays", "device_reads", "max_abs_diff", "device"}
Models (issue 22's): "bert" (4 layers, d 256, 4 heads, ff 1024, seq 128) and "gpt2" (4 layers,
d 256, 4 heads, seq 64, logits). Stacks:
    wgpu      cn.Wgpu() under cn.capture (call + reading the result back), against torch on the
              GPU (TF32 off, cuDNN included), whose result is read back to the host too
    wgpu+fusion  (--fusion) the same under cn.Fusion(cn.Wgpu())
    numpy     cn.NumPy() against onnxruntime's CPU provider with one thread (--cpu)
Cinders and its reference take turns call by call (timing.interleaved_median_ms: a shared
machine's load, a GPU's clocks and neighbours vary over a run); ratio = median over median.
Medians of --repeat calls after warm-up (capture's first three calls included in the warm-up).

With --decode, one JSON line per (batch, stack) of per-token decode latency of the GPT-2 model
exported with its KV cache (optimum-style: input_ids, attention_mask, position_ids and the past
keys/values in, logits and the present keys/values out; dynamo exporter):
    {"bench": "transformers-decode", "model", "batch", "prompt", "stack", "cinders_ms_per_token",
     "reference", "reference_ms_per_token", "ratio", "cinders_tokens_per_s", "same_tokens", "device"}
Cinders runs `cinders.onnx.generate_steps` (greedy; on a GPU backend each decode step replays
captured programs); the reference decodes greedily with its own cache: torch eager with
past_key_values (wgpu stack), or an onnxruntime session (1 thread) over the same ONNX file with
growing pasts (numpy stack). Cinders' per-token latency is its steady state: the time from the
WARM-th new token (the captures recorded, the device idle) to the LONG-th, read back, divided by
the tokens between (a recording collects Python's garbage first, which in a process holding
torch takes ~0.4 s and varies by 0.1 s: differences of whole runs drowned in it). The
reference's = (time of LONG new tokens - time of SHORT) / (LONG - SHORT). Medians of --repeat.
same_tokens: both picked the same greedy tokens.
After each decode line, one line of what keeping generate's captured programs saves a caller
that calls generate() per prompt (a chat loop, the /onnx/ page):
    {"bench": "transformers-generate-call", "model", "batch", "prompt", "new_tokens", "stack",
     "first_call_ms", "second_call_ms", "ratio", "first_call_records", "second_call_records",
     "same_tokens", "device"}
first: a generate() call of LONG new tokens after drop_programs (kernels compiled, programs
recorded); second: the same call again (the kept programs replayed); ratio = second / first;
records: cn.profile's "record" events in each; medians of --repeat pairs.

    python benchmarks/onnx_transformers.py --backend wgpu           # a real GPU (and torch with CUDA)
    python benchmarks/onnx_transformers.py --backend numpy          # cn.NumPy() vs onnxruntime, 1 thread
    python benchmarks/onnx_transformers.py --small                  # tiny shapes: lavapipe, a smoke run
    python benchmarks/onnx_transformers.py --backend wgpu --decode  # per-token decode latency
    python benchmarks/onnx_transformers.py --kernels                # + GPU time per kernel
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

# benchmarks/timing.py, also when a test or quantized.py loads this file by its path
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import interleaved_median_ms, kernel_table, median_ms  # noqa: E402

import numpy as np  # noqa: E402

import cinders as cn  # noqa: E402
from cinders.onnx import load  # noqa: E402

CONFIGS = {"bert": dict(layers=4, d=256, heads=4, ff=1024, seq=128),
           "gpt2": dict(layers=4, d=256, heads=4, ff=1024, seq=64)}
SMALL = dict(layers=2, d=32, heads=4, ff=64, seq=16)


def build(name, c):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import onnx_models
    onnx_models._torchvision_models()   # transformers imports torchvision when present: its stub
    import transformers as tf
    torch.manual_seed(0)
    if name == "bert":
        inner = tf.BertModel(tf.BertConfig(vocab_size=1000, hidden_size=c["d"], num_hidden_layers=c["layers"],
                                           num_attention_heads=c["heads"], intermediate_size=c["ff"],
                                           max_position_embeddings=512))
        call = lambda m, x: m(input_ids=x).last_hidden_state  # noqa: E731
    else:
        inner = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=1000, n_embd=c["d"], n_layer=c["layers"],
                                                 n_head=c["heads"], n_inner=c["ff"], n_positions=512,
                                                 bos_token_id=0, eos_token_id=0, use_cache=False))
        call = lambda m, x: m(input_ids=x, attention_mask=torch.ones_like(x)).logits  # noqa: E731

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return call(self.inner, x)
    return Wrapper().eval()


def export(model, seq, path):
    import torch
    ids = torch.randint(0, 1000, (2, seq))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), path, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}}, opset_version=17)



def gpu_rows(name, c, path, torch_model, batches, repeat, kernels=False, fusion=False):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = cn.Wgpu()
    backend = cn.Fusion(gpu) if fusion else gpu
    model = load(path, backend=backend)
    forward = cn.capture(model)
    reference = torch_model.to(device)
    for batch in batches:
        ids = np.random.default_rng(batch).integers(0, 1000, (batch, c["seq"])).astype(np.int64)
        x = cn.tensor(ids.astype(np.int32), backend=backend, dtype=cn.int32)
        tx = torch.tensor(ids, device=device)

        def ours():
            return forward(x).numpy()

        def theirs():  # read back to the host as well, as ours does
            with torch.no_grad():
                return reference(tx).float().cpu()
        times = interleaved_median_ms({"ours": ours, "theirs": theirs}, repeat, warm=4)
        ms, ref_ms = times["ours"], times["theirs"]
        with cn.profile(backend) as p:   # the forward alone: its device reads (0 expected)
            out = forward(x)
        got = out.numpy()
        want = theirs().numpy()
        yield {"bench": "transformers", "model": name, "batch": batch, "seq": c["seq"],
               "stack": "wgpu+fusion" if fusion else "wgpu",
               "cinders_ms": round(ms, 3), "reference": "torch-%s" % device, "reference_ms": round(ref_ms, 3),
               "ratio": round(ms / ref_ms, 3), "replays": forward.replays, "device_reads": p.device_reads,
               "max_abs_diff": float(np.abs(got - want).max()), "device": gpu.device.name}
        if kernels:  # where the GPU time goes: one uncaptured forward, GPU timestamps per kernel
            with cn.profile(backend) as p:
                model(x).numpy()
            total, table = kernel_table(p)
            yield {"bench": "transformers-kernels", "model": name, "batch": batch,
                   "stack": "wgpu+fusion" if fusion else "wgpu", "launches": p.kernel_launches,
                   "gpu_ms": total, "top": table, "device": gpu.device.name}


def cpu_rows(name, c, path, batches, repeat):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    backend = cn.NumPy()
    model = load(path, backend=backend)
    for batch in batches:
        ids = np.random.default_rng(batch).integers(0, 1000, (batch, c["seq"])).astype(np.int64)
        x = cn.tensor(ids.astype(np.int32), backend=backend, dtype=cn.int32)
        times = interleaved_median_ms({"ours": lambda: model(x).numpy(),
                                       "theirs": lambda: session.run(None, {"x": ids})}, repeat, warm=4)
        ms, ref_ms = times["ours"], times["theirs"]
        diff = float(np.abs(model(x).numpy() - session.run(None, {"x": ids})[0]).max())
        yield {"bench": "transformers", "model": name, "batch": batch, "seq": c["seq"], "stack": "numpy",
               "cinders_ms": round(ms, 3), "reference": "onnxruntime-cpu-1-thread", "reference_ms": round(ref_ms, 3),
               "ratio": round(ms / ref_ms, 3), "replays": None, "device_reads": None, "max_abs_diff": diff,
               "device": "cpu"}


# -- per-token decode latency with a KV cache ------------------------------------------------------

PROMPT, SHORT, LONG = 8, 8, 40   # prompt tokens; new tokens of the short and the long run


def gpt2_with_cache(c):
    """(GPT-2 of config c from `transformers` (random weights, eval mode), a wrapper taking
    (input_ids, attention_mask, position_ids, *pasts) and returning (logits, *presents))."""
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import onnx_models
    onnx_models._torchvision_models()
    import transformers as tf
    torch.manual_seed(0)
    inner = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=1000, n_embd=c["d"], n_layer=c["layers"], n_head=c["heads"],
                                             n_inner=c["ff"], n_positions=512, bos_token_id=0,
                                             eos_token_id=0)).eval()
    return inner, onnx_models.with_kv_cache(inner, c["layers"])


def export_with_cache(wrapper, c, path):
    import torch
    heads, head_dim, layers = c["heads"], c["d"] // c["heads"], c["layers"]
    pasts = ["past_key_values.%d.%s" % (i, kv) for i in range(layers) for kv in ("key", "value")]
    example = (torch.randint(0, 1000, (2, 3)), torch.ones(2, 7, dtype=torch.int64), torch.arange(4, 7).repeat(2, 1)) + \
        tuple(torch.randn(2, heads, 4, head_dim) for _ in pasts)
    dim = torch.export.Dim
    batch, seq = dim("batch", min=1, max=64), dim("seq", min=1, max=256)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: dim("total", min=1, max=512)}, {0: batch, 1: seq},
              tuple({0: batch, 2: dim("past", min=0, max=256)} for _ in pasts))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, example, dynamo=True, dynamic_shapes=shapes, verbose=False,
                          input_names=["input_ids", "attention_mask", "position_ids"] + pasts,
                          output_names=["logits"] + [n.replace("past_key_values", "present") for n in pasts]).save(path)


def per_token_ms(run, repeat):
    """(ms per new token, tokens of a LONG run): the median over --repeat interleaved pairs of
    (time of LONG new tokens - time of SHORT) / (LONG - SHORT), after one warm-up pair (a pair's
    two runs see the same load on the machine)."""
    def timed(new):
        start = time.perf_counter()
        rows = run(new)
        return (time.perf_counter() - start) * 1e3, rows
    timed(SHORT), timed(LONG)
    per_token = []
    for _ in range(repeat):
        short, _ = timed(SHORT)
        long, rows = timed(LONG)
        per_token.append((long - short) / (LONG - SHORT))
    return statistics.median(per_token), rows


WARM = 5   # a first call: the prompt step and a decode step uncaptured, two recorded; replays from the fifth token on


def steady_ms_per_token(model, prompt, repeat):
    """(ms per new token of generate_steps once its captures are recorded, tokens of a LONG run):
    the median over --repeat runs of the time from the WARM-th token to the LONG-th, read back
    (the steps never wait for the device: the read at the end waits for them all)."""
    from cinders.onnx.generate import generate_steps
    per_token = []
    for _ in range(repeat + 1):   # the first run compiles
        steps = generate_steps(model, prompt, LONG)
        picked = [next(steps) for _ in range(WARM)]
        picked[-1].tolist()
        start = time.perf_counter()
        picked += list(steps)
        picked[-1].tolist()
        per_token.append((time.perf_counter() - start) * 1e3 / (LONG - WARM))
    rows = [list(r) for r in prompt]
    for ids in picked:
        for r, (token,) in zip(rows, ids.tolist()):
            r.append(int(token))
    return statistics.median(per_token[1:]), rows


def generate_call_ms(model, backend, prompt, repeat):
    """(median ms of a first generate() call of LONG tokens, of the second, their records, whether
    both gave the same tokens): each pair after drop_programs, with the kernels already compiled."""
    from cinders.onnx import generate
    from cinders.onnx.generate import drop_programs

    def timed_call():
        with cn.profile(backend) as p:
            start = time.perf_counter()
            rows = generate(model, prompt, LONG)
            ms = (time.perf_counter() - start) * 1e3
        return ms, rows, sum(1 for e in p.events if e["kind"] == "record")
    pairs = []
    for _ in range(repeat):
        drop_programs(model)
        pairs.append([timed_call(), timed_call()])
    (_, rows, first_records), (_, again, second_records) = pairs[-1]
    return (statistics.median(first[0] for first, _ in pairs), statistics.median(second[0] for _, second in pairs),
            first_records, second_records, rows == again)


def torch_greedy(inner, prompt, new, device):
    import torch
    with torch.no_grad():
        ids = torch.tensor(prompt, device=device)
        out = inner(input_ids=ids, use_cache=True)
        tokens = []
        for _ in range(new):
            picked = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(picked)
            out = inner(input_ids=picked, past_key_values=out.past_key_values, use_cache=True)
        if device == "cuda":
            torch.cuda.synchronize()
        rows = torch.cat([ids] + tokens, 1).tolist()
    return rows


def ort_greedy(session, c, prompt, new):
    names = [i.name for i in session.get_inputs()]
    heads, head_dim = c["heads"], c["d"] // c["heads"]
    rows = [list(r) for r in prompt]
    ids, filled = np.array(prompt, np.int64), 0
    past = {n: np.zeros((len(prompt), heads, 0, head_dim), np.float32) for n in names[3:]}
    for _ in range(new):
        n = ids.shape[1]
        feed = dict(past, input_ids=ids, attention_mask=np.ones((len(prompt), filled + n), np.int64),
                    position_ids=np.tile(np.arange(filled, filled + n), (len(prompt), 1)))
        logits, *presents = session.run(None, {k: feed[k] for k in names})
        past, filled = dict(zip(names[3:], presents)), filled + n
        ids = logits[:, -1].argmax(-1).reshape(-1, 1).astype(np.int64)
        for r, (t,) in zip(rows, ids):
            r.append(int(t))
    return rows


def decode_rows(c, path, inner, stack, batches, repeat):
    backend = cn.Wgpu() if stack == "wgpu" else cn.NumPy()
    model = load(path, backend=backend)
    if stack == "wgpu":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        inner = inner.to(device)
        reference, theirs = "torch-%s-eager" % device, lambda prompt, new: torch_greedy(inner, prompt, new, device)
    else:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        reference, theirs = "onnxruntime-cpu-1-thread", lambda prompt, new: ort_greedy(session, c, prompt, new)
    for batch in batches:
        prompt = np.random.default_rng(batch).integers(0, 1000, (batch, PROMPT)).tolist()
        ms, ours = steady_ms_per_token(model, prompt, repeat)
        ref_ms, want = per_token_ms(lambda new: theirs(prompt, new), repeat)
        yield {"bench": "transformers-decode", "model": "gpt2", "batch": batch, "prompt": PROMPT, "stack": stack,
               "cinders_ms_per_token": round(ms, 3), "reference": reference,
               "reference_ms_per_token": round(ref_ms, 3), "ratio": round(ms / ref_ms, 3),
               "cinders_tokens_per_s": round(1e3 * batch / ms, 1), "same_tokens": ours == want,
               "device": backend.device.name if stack == "wgpu" else "cpu"}
        first, second, first_records, second_records, same = generate_call_ms(model, backend, prompt, repeat)
        yield {"bench": "transformers-generate-call", "model": "gpt2", "batch": batch, "prompt": PROMPT,
               "new_tokens": LONG, "stack": stack, "first_call_ms": round(first, 1),
               "second_call_ms": round(second, 1), "ratio": round(second / first, 3),
               "first_call_records": first_records, "second_call_records": second_records, "same_tokens": same,
               "device": backend.device.name if stack == "wgpu" else "cpu"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["wgpu", "numpy"], default="wgpu",
                        help="wgpu: captured on cn.Wgpu() vs torch; numpy: cn.NumPy() vs onnxruntime (1 thread)")
    parser.add_argument("--cpu", action="store_true", help="the same as --backend numpy")
    parser.add_argument("--decode", action="store_true", help="per-token decode latency of GPT-2 with a KV cache")
    parser.add_argument("--small", action="store_true", help="tiny shapes (lavapipe smoke run)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--models", nargs="*", default=sorted(CONFIGS))
    parser.add_argument("--fusion", action="store_true", help="also cn.Fusion(cn.Wgpu()) (wgpu)")
    parser.add_argument("--kernels", action="store_true",
                        help="also a line per (model, batch) with the GPU time of each kernel (wgpu)")
    args = parser.parse_args()
    args.cpu = args.cpu or args.backend == "numpy"
    with tempfile.TemporaryDirectory() as folder:
        if args.decode:
            c = SMALL if args.small else CONFIGS["gpt2"]
            inner, wrapper = gpt2_with_cache(c)
            path = os.path.join(folder, "gpt2-kv.onnx")
            export_with_cache(wrapper, c, path)
            for row in decode_rows(c, path, inner, "numpy" if args.cpu else "wgpu", args.batches, args.repeat):
                print(json.dumps(row), flush=True)
            return
        for name in args.models:
            c = SMALL if args.small else CONFIGS[name]
            model = build(name, c)
            path = os.path.join(folder, name + ".onnx")
            export(model, c["seq"], path)
            if args.cpu:
                stacks = [cpu_rows(name, c, path, args.batches, args.repeat)]
            else:
                stacks = [gpu_rows(name, c, path, model, args.batches, args.repeat, args.kernels, fusion)
                          for fusion in ((False, True) if args.fusion else (False,))]
            for rows in stacks:
                for row in rows:
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
