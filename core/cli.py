"""The `cinders` command (also `python -m cinders`).

    cinders train mnist --model cnn --epochs 15 --out mnist-cnn.safetensors
    cinders eval mnist mnist-cnn.safetensors            -> accuracy: 0.9871
    cinders predict mnist-cnn.safetensors digit.json    -> {"class": 7, "logits": [...]}

Each subcommand is one function `run(args) -> exit code`, registered with @command(name, help,
arguments). Adding one is adding a function: main() builds the argparse tree from COMMANDS.
"""

import argparse
import json
import os
import sys
import time

COMMANDS = {}  # name -> (help, [(args, kwargs)], run)


def arg(*args, **kwargs):
    return args, kwargs


def command(name, help, arguments=()):  # noqa: A002  (argparse's word)
    def register(run):
        COMMANDS[name] = (help, list(arguments), run)
        return run
    return register


BACKEND_ARG = arg("--backend", default="numpy", choices=["numpy", "python", "wgpu", "fusion-wgpu"],
                  help="compute backend (default: numpy)")


THREADS_ARG = arg("--threads", type=int, default=1,
                  help="BLAS threads (default 1: MNIST's small matmuls gain little from more and "
                       "lose a lot when the cores are busy)")


def make_backend(name):
    import cinders as cn
    if name == "numpy":
        return cn.NumPy()
    if name == "python":
        return cn.Python()
    if name == "wgpu":
        return cn.Wgpu()
    if name == "fusion-wgpu":
        return cn.Fusion(cn.Wgpu())
    raise ValueError("unknown backend %r" % (name,))


def _err(text):
    print("cinders: " + text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- train

# The default recipe: what `cinders train mnist` runs. Pixels stay in [0, 1] (no normalisation),
# as the browser and board demos feed them.
RECIPES = {
    "mlp": {"epochs": 20, "lr": 2e-3, "weight_decay": 1e-4, "warmup_epochs": 1, "label_smoothing": 0.05,
            "augment": {"rotate": 10.0, "scale": 0.1, "shift": 2.0, "elastic": 1.0}},
    "cnn": {"epochs": 15, "lr": 2e-3, "weight_decay": 1e-4, "warmup_epochs": 1, "label_smoothing": 0.05,
            "augment": {"rotate": 10.0, "scale": 0.1, "shift": 2.0, "elastic": 1.0}},
}


def build_training(model_name, backend, epochs=None, batch_size=64, lr=None, seed=0, augment=True,
                   workers=1, train_limit=None, dashboard="auto", out_dir=None, capture="auto"):
    """(learner, train loader, held-out loader, epochs) of the default MNIST recipe."""
    import cinders as cn
    from cinders.data import DataLoader, Subset
    from cinders.data.augment import RandomDistortion
    from cinders.data.mnist import MnistBatcher, MnistDigits
    from cinders.models.mnist import MnistCNN, MnistMLP
    from cinders.nn import functional as F
    from cinders.train import Learner

    recipe = RECIPES[model_name]
    epochs = epochs or recipe["epochs"]
    lr = lr or recipe["lr"]
    cn.manual_seed(seed)
    trained_on = cn.Autodiff(backend)
    model = (MnistMLP() if model_name == "mlp" else MnistCNN()).to(trained_on)
    train_set = MnistDigits("train")
    if train_limit:
        import random
        train_set = Subset(train_set, sorted(random.Random(seed).sample(range(len(train_set)), train_limit)))
    distort = RandomDistortion(**recipe["augment"]) if augment else None
    train = DataLoader(train_set, batch_size, shuffle=True, seed=seed,
                       batcher=MnistBatcher(trained_on, augment=distort), num_workers=workers)
    heldout = DataLoader(MnistDigits("heldout"), 500, batcher=MnistBatcher(trained_on))
    total = epochs * len(train)
    warmup = recipe["warmup_epochs"] * len(train)
    schedule = cn.optim.LinearWarmup(cn.optim.CosineAnnealing(lr, total_steps=total), warmup_steps=warmup)
    optimizer = cn.optim.AdamW(lr=schedule, weight_decay=recipe["weight_decay"])
    smoothing = recipe["label_smoothing"]

    def loss(logits, labels):
        return F.cross_entropy(logits, labels, label_smoothing=smoothing)

    learner = Learner(model, optimizer, loss, out_dir=out_dir, dashboard=dashboard,
                      title="cinders train mnist --model %s (%s)" % (model_name, backend.name),
                      capture=capture)
    return learner, train, heldout, epochs


@command("train", "train a model on the real MNIST digits and save its record", [
    arg("dataset", choices=["mnist"]),
    arg("--model", choices=["mlp", "cnn"], default="cnn"),
    arg("--epochs", type=int, default=None, help="default: the recipe's (mlp 20, cnn 15)"),
    arg("--out", required=True, help="where to save the trained record (.safetensors)"),
    BACKEND_ARG,
    arg("--batch-size", type=int, default=64),
    arg("--lr", type=float, default=None, help="peak learning rate (default: the recipe's)"),
    arg("--seed", type=int, default=0),
    arg("--no-augment", action="store_true", help="train on the digits as they are"),
    arg("--workers", type=int, default=1, help="threads preparing batches (default 1)"),
    arg("--train-limit", type=int, default=None, help="train on a random subset of this many digits"),
    arg("--run-dir", default=None, help="checkpoints, logs and plots (default: runs/mnist-MODEL)"),
    arg("--resume", action="store_true", help="continue from the run directory's checkpoint"),
    arg("--dashboard", choices=["auto", "rich", "plain"], default="auto"),
    arg("--capture", choices=["auto", "on", "off"], nargs="?", const="on", default="auto",
        help="run the training step through cn.capture (default auto: on GPU backends)"),
    THREADS_ARG,
])
def train(args):
    run_dir = args.run_dir or os.path.join("runs", "mnist-" + args.model)
    learner, train_loader, heldout, epochs = build_training(
        args.model, make_backend(args.backend), args.epochs, args.batch_size, args.lr, args.seed,
        not args.no_augment, args.workers, args.train_limit, args.dashboard, run_dir,
        {"auto": "auto", "on": True, "off": False}[args.capture])
    t0 = time.time()
    try:
        learner.fit(train_loader, heldout, epochs, resume=args.resume)
    except KeyboardInterrupt:
        _err("interrupted; the checkpoint is in %s; continue with the same command and --resume" % run_dir)
        return 130
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    learner.model.save(args.out)
    accuracy = learner.history[-1].get("valid_accuracy", float("nan"))
    print("saved %s  held-out accuracy %.4f  (%d epochs, %.0f s this run; logs in %s)"
          % (args.out, accuracy, epochs, time.time() - t0, run_dir), flush=True)
    return 0


# ---------------------------------------------------------------- eval / predict

def load_record(path, backend_name):
    import cinders as cn
    return cn.load_model(path, backend=make_backend(backend_name))


def heldout_accuracy(model, batch_size=500):
    from cinders.autodiff import no_grad
    from cinders.data import DataLoader
    from cinders.record import backend_of
    from cinders.data.mnist import MnistBatcher, MnistDigits
    backend = backend_of(model.state_dict())
    loader = DataLoader(MnistDigits("heldout"), batch_size, batcher=MnistBatcher(backend))
    model.eval()
    hits = total = 0
    with no_grad():
        for images, labels in loader:
            hits += (model(images).argmax(axis=-1) == labels).sum().item()
            total += labels.shape[0]
    return hits / total


@command("eval", "print a record's accuracy on the held-out MNIST digits", [
    arg("dataset", choices=["mnist"]),
    arg("record", help="a .safetensors record written by cinders"),
    BACKEND_ARG,
    THREADS_ARG,
])
def evaluate(args):
    model = load_record(args.record, args.backend)
    print("accuracy: %.4f" % heldout_accuracy(model), flush=True)
    return 0


def read_digit(path):
    """784 floats in [0, 1] (row-major 28x28) from a JSON file."""
    from cinders.inputs import read_json
    pixels = read_json(path)  # size-capped; InputError (a ValueError) for a bad file
    if (not isinstance(pixels, list) or len(pixels) != 784
            or not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in pixels)):
        raise ValueError("%s must hold a JSON list of 784 numbers (a 28x28 image, row-major), got %s"
                         % (path, "%d items" % len(pixels) if isinstance(pixels, list) else type(pixels).__name__))
    bad = [p for p in pixels if not 0.0 <= p <= 1.0]
    if bad:
        raise ValueError("%s: pixels must be in [0, 1]; found %r" % (path, bad[0]))
    return [float(p) for p in pixels]


@command("predict", "classify one 28x28 digit given as a JSON list of 784 floats in [0, 1]", [
    arg("record"),
    arg("input", help="JSON file: a list of 784 floats in [0, 1], row-major 28x28"),
    BACKEND_ARG,
    THREADS_ARG,
])
def predict(args):
    import cinders as cn
    pixels = read_digit(args.input)
    backend = make_backend(args.backend)
    model = cn.load_model(args.record, backend=backend)
    model.eval()
    logits = model(cn.tensor(pixels, backend=backend).reshape(1, 1, 28, 28)).reshape(-1).tolist()
    best = max(range(len(logits)), key=lambda k: logits[k])
    print(json.dumps({"class": best, "logits": [round(v, 6) for v in logits]}), flush=True)
    return 0


# ---------------------------------------------------------------- demo

@command("demo", "set up what is missing and serve the browser demos on http://127.0.0.1:PORT/", [
    arg("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000)"),
    arg("--no-open", action="store_true", help="do not open a web browser"),
])
def demo(args):
    from cinders.web.server import demo as serve
    serve(port=args.port, open_browser=not args.no_open)
    return 0


# ---------------------------------------------------------------- convert

@command("convert", "convert a PyTorch checkpoint (torch.save .pt/.pth) to safetensors, running none of its code", [
    arg("checkpoint", help="a torch.save file: zip (torch >= 1.6), legacy or plain pickle"),
    arg("--out", required=True, help="safetensors file to write"),
    arg("--key", help="top-level key holding the state dict, e.g. state_dict or model.backbone "
                      "(default: found automatically)"),
    arg("--remap", nargs="*", default=[], metavar="REGEX=REPL",
        help="rename keys: each rule is re.sub(REGEX, REPL, key), applied in order; split at the last '='"),
    arg("--model-class", help="load into this cinders.models class (e.g. cinders.models.vision.ResNet) and "
                              "write a cinders record that cn.load_model / export-micro rebuild"),
    arg("--model-config", default="{}", help="JSON constructor arguments for --model-class"),
])
def convert(args):
    from cinders.record.pytorch import convert_pytorch
    rules = []
    for rule in args.remap:
        pattern, eq, replacement = rule.rpartition("=")
        if not eq:
            raise ValueError("--remap %r: write REGEX=REPLACEMENT" % (rule,))
        rules.append((pattern, replacement))
    try:
        config = json.loads(args.model_config)
    except ValueError as e:
        raise ValueError("--model-config is not JSON (%s)" % (e,)) from None
    if not isinstance(config, dict):
        raise ValueError("--model-config must be a JSON object, got %r" % (args.model_config,))
    state = convert_pytorch(args.checkpoint, args.out, top_level_key=args.key, remap=rules,
                            model_class=args.model_class, model_config=config,
                            progress=lambda text: print(text, flush=True))
    grouped = {}  # "int64 stored, loaded as int32 (range checked)" -> [tensor names]
    for note in state.notes:
        name, _, what = note.partition(": ")
        grouped.setdefault(what, []).append(name)
    for what, names in grouped.items():
        shown = ", ".join(names[:3]) + (", ... (%d in all)" % len(names) if len(names) > 3 else "")
        print("note: %s: %s" % (what, shown), flush=True)
    for key, what in state.other.items():
        print("also in the file (not converted): %s: %s" % (key, what), flush=True)
    return 0


# ---------------------------------------------------------------- micro

from .micro import commands as _micro_commands  # noqa: E402,F401  (quantize, export-micro, flash)


# ---------------------------------------------------------------- import-onnx

@command("import-onnx", "turn an ONNX model into readable cinders Python (DIR/NAME.py + DIR/NAME.safetensors)", [
    arg("model", help="the .onnx file (external data files next to it are read too)"),
    arg("--out", required=True, help="folder to write NAME.py and NAME.safetensors into"),
    arg("--name", default=None, help="module name (default: from the file name)"),
])
def import_onnx(args):
    from cinders.onnx import import_onnx as write
    started = time.perf_counter()
    py_path, record_path = write(args.model, args.out, args.name)
    name = os.path.splitext(os.path.basename(py_path))[0]
    print("wrote %s and %s in %.2f s" % (py_path, record_path, time.perf_counter() - started))
    print("use it: cd %s && python -c \"from %s import Model; m = Model.load('%s.safetensors')\""
          % (args.out, name, name))
    return 0


# ---------------------------------------------------------------- main

def build_parser():
    parser = argparse.ArgumentParser(prog="cinders", description="Cinders: train, evaluate and run models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        for a, kw in arguments:
            p.add_argument(*a, **kw)
        p.set_defaults(run=run)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        # Read by OpenBLAS/MKL/OpenMP when NumPy loads, which has not happened yet.
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    from cinders.errors import CindersError
    try:
        return args.run(args)
    except (CindersError, ValueError, OSError) as e:
        _err(str(e))
        return 1
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
