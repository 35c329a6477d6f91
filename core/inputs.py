"""Reading input files a user names (a digit to classify, a data file) with a size cap, so a
path like /dev/zero or a 20 GB file gets a clear InputError instead of filling the memory, and
JSON nested beyond reason is an InputError, not a RecursionError traceback."""

import json

from .errors import InputError

MAX_INPUT_BYTES = 64 << 20  # 64 MB: far above any single input, far below any memory
MAX_DATASET_BYTES = 2 << 30  # 2 GB: a whole dataset file (EMNIST's largest is 0.64 GB)


def read_bytes(path, max_bytes=MAX_INPUT_BYTES, opener=open):
    """The bytes of `path`, reading at most max_bytes + 1 (works for endless devices, and for
    gzip bombs with opener=gzip.open: the cap applies to the decompressed bytes)."""
    try:
        with opener(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except (OSError, EOFError) as e:  # (gzip raises BadGzipFile, an OSError, and EOFError)
        raise InputError("cannot read %s: %s" % (path, getattr(e, "strerror", None) or e)) from None
    if len(data) > max_bytes:
        raise InputError("%s is larger than %d bytes; inputs are read whole, so this is refused"
                         % (path, max_bytes))
    return data


def read_json(path, max_bytes=MAX_INPUT_BYTES):
    """The JSON value in `path` (UTF-8), read with a size cap."""
    data = read_bytes(path, max_bytes)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InputError("%s is not UTF-8 text (%s)" % (path, e)) from None
    except RecursionError:
        raise InputError("%s nests JSON arrays/objects too deeply" % (path,)) from None
    except ValueError as e:
        raise InputError("%s is not JSON (%s)" % (path, e)) from None
