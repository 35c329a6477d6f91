"""Mutation fuzzer for cinders.record.load_pytorch (issue 10 item 5), run by
tests/test_pytorch_fuzz.py in a child process with an address-space cap:

    python tests/pytorch_fuzz.py --seed 0 --count 3000 --cap-mb 1024 sample.zip.pt sample.legacy.pt sample.plain.pkl

Each case mutates one seed file (bit flips, truncation, inserted/deleted/overwritten/duplicated
bytes), either the raw file or, for zip archives, the data.pkl inside it (re-zipped with valid
CRCs so the pickle interpreter itself is exercised). Every case must give a state dict or a
CindersError; anything else (another exception, a case over the time limit, MemoryError under
the cap) is a failure. A raw zip mutation that loads must give the original tensors (the CRCs
guard every byte that matters). Prints one JSON line of counts.
"""

import argparse
import io
import json
import random
import resource
import signal
import sys
import zipfile

import cinders as cn
from cinders.record import load_pytorch


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def mutate(data, rng):
    data = bytearray(data)
    kind = rng.choice(["flip", "flip", "truncate", "insert", "delete", "overwrite", "duplicate", "repeat"])
    if not data:
        return bytes(data), kind
    at = rng.randrange(len(data))
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[at:]
    elif kind == "insert":
        data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "delete":
        del data[at:at + rng.randint(1, 16)]
    elif kind == "overwrite":
        n = rng.randint(1, 16)
        data[at:at + n] = bytes(rng.choice([0, 255, rng.randrange(256)]) for _ in range(n))
    elif kind == "duplicate":
        n = rng.randint(1, 32)
        data[at:at] = data[at:at + n]
    else:  # one region named many times: memo reads, views and storages shared by many tensors
        n = rng.randint(1, 32)
        data[at:at] = data[at:at + n] * rng.choice([10, 100, 1000])
    return bytes(data), kind


def rezip(original, pickle_bytes):
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, pickle_bytes if info.filename.endswith("/data.pkl") else src.read(info))
    return out.getvalue()


def snapshot(state):
    return {k: (t.shape, t.dtype.name, t.numpy().tobytes()) for k, t in state.items()}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--cap-mb", type=int, default=1024, help="address space allowed beyond start-up")
    ap.add_argument("--case-seconds", type=float, default=5.0)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    backend = cn.NumPy()
    seeds = []
    for path in args.files:
        data = open(path, "rb").read()
        seeds.append((path, data, snapshot(load_pytorch(io.BytesIO(data), backend=backend))))
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    cap = vm + (args.cap_mb << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(args.seed)
    counts = {"cases": 0, "loaded_same": 0, "loaded_changed": 0, "refused": 0, "failures": 0}
    by_kind, failures = {}, []
    for case in range(args.count):
        path, data, expected = seeds[case % len(seeds)]
        inner = zipfile.is_zipfile(io.BytesIO(data)) and rng.random() < 0.5
        if inner:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
                mutated, kind = mutate(z.read(name), rng)
            mutated, kind = rezip(data, mutated), "pickle-" + kind
        else:
            mutated, kind = mutate(data, rng)
        counts["cases"] += 1
        outcome = None
        signal.setitimer(signal.ITIMER_REAL, args.case_seconds)
        try:
            state = load_pytorch(io.BytesIO(mutated), backend=backend)
            got = snapshot(state)
            outcome = "loaded_same" if got == expected else "loaded_changed"
            if outcome == "loaded_changed" and zipfile.is_zipfile(io.BytesIO(data)) and not inner:
                outcome = "failures"
                failures.append("case %d (%s, %s): a raw zip mutation loaded different tensors" % (case, path, kind))
        except cn.CindersError:
            outcome = "refused"
        except CaseTimeout:
            outcome = "failures"
            failures.append("case %d (%s, %s): over %.1f s" % (case, path, kind, args.case_seconds))
        except BaseException as e:  # noqa: B036  (the point: nothing but CindersError may escape)
            outcome = "failures"
            failures.append("case %d (%s, %s): %s: %s" % (case, path, kind, type(e).__name__, str(e)[:200]))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        counts[outcome] += 1
        by_kind.setdefault(kind, {}).setdefault(outcome, 0)
        by_kind[kind][outcome] += 1
    counts["by_mutation"] = by_kind
    with open("/proc/self/status") as f:  # VmHWM: ru_maxrss would report the parent's peak (kept across exec)
        counts["peak_rss_mb"] = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) // 1024
    counts["cap_mb_beyond_startup"] = args.cap_mb
    counts["failure_examples"] = failures[:20]
    print(json.dumps(counts, sort_keys=True))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
