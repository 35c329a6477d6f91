"""The command-line entries of cinders.micro, registered in the `cinders` command's table:
`cinders quantize`, `cinders export-micro`, `cinders flash` (also `python -m cinders.micro`)."""
import os

from ..cli import arg, command, shape_arg


@command("quantize", "write the int8 record of a record, or the q8/q4 version of an ONNX model "
                     "with an accuracy report", [
    arg("record", help="float32/float16 record (.safetensors), or an ONNX model (.onnx)"),
    arg("--out", required=True, help="int8 record, or quantized .onnx, to write"),
    arg("--mode", choices=("q8", "q4"),
        help="ONNX only (default q8): q8 = int8 per-column MatMul weights (DynamicQuantizeMatMul), "
             "q4 = 4-bit blocks of 32 (MatMulNBits); in both Conv weights int8 per output channel "
             "(DequantizeLinear); needs the onnx package"),
    arg("--batch", type=int, default=8, help="rows of random input for the accuracy report"),
    arg("--data", metavar="FILE", help="inputs for the accuracy report instead of random ones: for an ONNX "
                                       "model a .npz with one array per input name or a .npy of the one "
                                       "input; for a record a JSON list (one sample or a batch, as "
                                       "`cinders predict` reads)"),
])
def quantize(args):
    if args.record.lower().endswith(".onnx"):
        return _quantize_onnx(args)
    if args.mode is not None:
        raise ValueError("--mode %s is for ONNX models: a record is quantized to int8 per channel (leave --mode out)"
                         % args.mode)
    from ..cli import read_json_file
    from .quantize import quantize_file
    data = read_json_file(args.data) if args.data else None   # a bad file is refused before writing
    quantize_file(args.record, args.out)
    print("wrote %s (int8 per-channel weights, float32 scales; %d -> %d bytes)"
          % (args.out, os.path.getsize(args.record), os.path.getsize(args.out)), flush=True)
    _record_report(args, data)
    return 0


def _record_report(args, data):
    """The accuracy report of an int8 record: both records' models on the --data inputs (what
    `cinders predict` or `eval --data` reads), or on --batch random samples of the shape the
    record (else the model class) states."""
    import cinders as cn
    from ..cli import flat_numbers, input_batch, input_shape_of
    from ..record import load_model, read_header
    models = [load_model(path) for path in (args.record, args.out)]
    meta = read_header(args.record)[0]
    if data is not None:
        numbers = flat_numbers(data["inputs"] if isinstance(data, dict) and "inputs" in data else data, args.data)
        values, shape = input_batch(numbers, input_shape_of(models[0], meta, None, len(numbers)), args.data,
                                    models[0])
        x, source = cn.tensor(values).reshape(shape), args.data
    else:
        shape = input_shape_of(models[0], meta)
        if shape is None:
            print("no accuracy report: the record states no input shape (give --data)", flush=True)
            return
        x = cn.random((args.batch,) + tuple(shape), distribution="normal", seed=0)
        source = "random inputs (batch %d)" % args.batch
    _report(source, *[model(x) for model in models])


def _report(source, reference, quantized):
    """Print the largest absolute difference of the two outputs (and its share of the largest
    reference value: random weights can give outputs near 0) and the share of rows (along the
    last dim) whose argmax agree."""
    error = (reference - quantized).abs().max().item()
    largest = reference.abs().max().item()
    rows = [t.reshape((-1, t.shape[-1] if t.ndim else 1)).tolist() for t in (reference, quantized)]
    agree = sum(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__)
                for a, b in zip(*rows)) / len(rows[0])
    print("accuracy on %s: max error %.6g (%.3g%% of the largest output), argmax agreement %.1f%%"
          % (source, error, 100 * error / largest if largest else 0.0, 100 * agree), flush=True)


def _quantize_onnx(args):
    from ..onnx.quantize import outputs, quantize_model, random_inputs, read_inputs
    mode = args.mode or "q8"
    feeds = random_inputs(args.record, batch=args.batch)
    if args.data:
        feeds = read_inputs(args.data, list(feeds))   # a bad file is refused before writing
    matmuls, convs = quantize_model(args.record, args.out, mode)
    reference, quantized = outputs(args.record, args.out, feeds)
    print("wrote %s (%s: %d MatMul weights quantized, %d Conv weights int8; %d -> %d bytes)"
          % (args.out, mode, matmuls, convs, os.path.getsize(args.record), os.path.getsize(args.out)))
    _report(args.data or "random inputs (batch %d)" % args.batch, reference, quantized)
    return 0


@command("export-micro", "bundle a record for MicroPython: runtime, model source, record, predict.py", [
    arg("record", help="model record (.safetensors) naming its model_class"),
    arg("--out", required=True, help="bundle directory to write"),
    arg("--mpy", action="store_true", help="compile the runtime to .mpy with mpy-cross"),
    arg("--model-source", metavar="FILE",
        help="the .py file defining the model class (needed for any model but Cinders' own; "
             "the NAME.py that `cinders import-onnx` wrote for an imported graph)"),
    arg("--input-shape", metavar="A,B,...", type=shape_arg,
        help="shape of one input sample, e.g. 1,28,28 (default: recorded by model.save once the "
             "model has run, else the class's input_shape attribute)"),
    arg("--model-class", help="for a PyTorch .pt input: the cinders.models class its state dict loads into"),
    arg("--model-config", default="{}", help="for a PyTorch .pt input: JSON constructor arguments"),
    arg("--freeze", action="store_true", help="write frozen/ and manifest.py (for `cinders firmware "
                                               "--freeze`) instead of lib/: code in flash, not heap"),
])
def export_micro(args):
    import json
    from .export import export_micro as export
    if args.record.lower().endswith(".onnx"):
        raise ValueError("%s is an ONNX model, not a Cinders record: run `cinders import-onnx %s --out DIR` "
                         "first, then export-micro the DIR/NAME.safetensors it writes" % (args.record, args.record))
    try:
        config = json.loads(args.model_config)
    except ValueError as e:
        raise ValueError("--model-config is not JSON (%s)" % (e,)) from None
    files = export(args.record, args.out, mpy=args.mpy, model_file=args.model_source,
                   input_shape=args.input_shape, model_class=args.model_class, model_config=config,
                   freeze=args.freeze)
    if args.freeze:
        manifest = os.path.join(args.out, "manifest.py")
        print("wrote %d files to %s; build the firmware: cinders firmware --freeze %s, then run "
              "predict.py INPUT.json in %s with it" % (len(files), args.out, manifest, args.out),
              flush=True)
    else:
        print("wrote %d files to %s; run: cd %s && micropython predict.py INPUT.json"
              % (len(files), args.out, args.out), flush=True)
    return 0


HEAP_ARG = arg("--heap", type=int, metavar="BYTES",
                help="run the model in only this much of the board's heap, the rest reserved first "
                     "(flash: with --run): does it fit a board with less RAM?")


@command("flash", "install a bundle on a board over its serial port (mpremote)", [
    arg("bundle", help="directory written by export-micro"),
    arg("--port", required=True, help="serial port of the board, e.g. /dev/ttyUSB0 or /dev/pts/3"),
    arg("--method", default="auto", choices=("auto", "fs", "romfs"),
        help="fs: copy files (boards with a writable filesystem); romfs: write a ROMFS image; "
             "auto (default): fs where the board can write files, else romfs"),
    arg("--run", dest="run_input", metavar="INPUT",
        help="then run the model on INPUT (JSON list of numbers, flat or nested: one sample of "
             "the record's input_shape or a batch) and print the board's JSON answer"),
    arg("--dry-run", action="store_true", help="print the mpremote file-copy command only"),
    arg("--mpremote", default="mpremote", help="mpremote executable"),
    HEAP_ARG,
])
def flash(args):
    from . import board
    from .export import flash as print_copy_command
    if args.dry_run:
        return print_copy_command(args.bundle, args.port, dry_run=True, mpremote=args.mpremote)
    how = board.flash(args.bundle, args.port, method=args.method, mpremote=args.mpremote)
    print("flashed %s to %s (%s)" % (args.bundle, args.port,
                                     "files copied" if how == "fs" else "ROMFS image, at /rom"),
          flush=True)
    if args.run_input:
        return _run_board(args.port, args.run_input, args.heap)
    return 0


def _run_board(port, input_path, heap):
    import json

    from . import board
    from ..errors import BoardError
    try:
        with open(input_path) as f:
            values = json.load(f)
    except OSError as e:
        raise BoardError("cannot read the input %s: %s" % (input_path, e.strerror or e)) from None
    except ValueError as e:
        raise BoardError("the input %s is not JSON: %s" % (input_path, e)) from None
    print(json.dumps(board.run(port, values, heap=heap)), flush=True)
    return 0


@command("run-board", "run the flashed model on a board; prints its JSON answer", [
    arg("input", help="JSON list of numbers, flat or nested: one sample of the record's "
                      "input_shape (e.g. 784 floats of a 28x28 digit) or a batch"),
    arg("--port", required=True, help="serial port of the board"),
    HEAP_ARG,
])
def run_board(args):
    return _run_board(args.port, args.input, args.heap)


@command("firmware", "build MicroPython with ulab from source (cached); prints the binary's path", [
    arg("--port", default="unix", choices=("unix", "qemu"), help="unix port, or qemu (MPS2 AN500)"),
    arg("--float", default="float", choices=("float", "double"), help="float32 or double"),
    arg("--dims", type=int, default=4, help="ulab's maximum dimensions (1-4)"),
    arg("--heap", type=int, help="qemu board's heap in bytes (default: the port's 140 KB)"),
    arg("--freeze", metavar="MANIFEST", help="freeze a bundle (its manifest.py from "
                                              "export-micro --freeze) into the firmware"),
])
def firmware(args):
    from .firmware import build
    fw = build(port=args.port, float=args.float, dims=args.dims, heap=args.heap,
               manifest=args.freeze)
    print(fw.path, flush=True)
    return 0


NAMES = ("quantize", "export-micro", "flash", "run-board", "firmware")
