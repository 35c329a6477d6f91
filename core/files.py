"""Opening files a user or a file names: regular files only, inside the folder they belong to.

One rule for the readers (an ONNX model and its external data), the demo server and the
writers of `--out`: a FIFO would block a read forever, a device (/dev/zero) never ends, a
symlink inside a model's or a served folder can point anywhere, and `os.replace` onto a symlink
or a device node replaces it. Each function raises the caller's CindersError subclass (`error`)
with a one-line message.
"""

import os
import stat


def inside(folder, relative, error, what, folder_name="its folder"):
    """The real path of `relative` under `folder`, refused when it is absolute, climbs with "..",
    or resolves (through symlinks) to a place outside the folder's real path."""
    parts = relative.replace("\\", "/").split("/")
    if os.path.isabs(relative) or relative.startswith(("/", "\\")) or ".." in parts or "\0" in relative:
        raise error("%s %s leaves %s" % (what, ascii(relative), folder_name))
    root = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(root, *[p for p in parts if p not in ("", ".")]))
    if os.path.commonpath([root, real]) != root:
        raise error("%s %s leaves %s: it resolves through a symlink to %s, outside %s"
                    % (what, ascii(relative), folder_name, ascii(real), ascii(root)))
    return real


def open_regular(path, error, what):
    """A binary file object of the regular file at `path`; a FIFO, device, socket or directory is
    refused before anything is read (the open does not block on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise error("cannot open %s %s: %s" % (what, ascii(str(path)), e.strerror or e)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error("%s %s is %s, not a regular file" % (what, ascii(str(path)), kind_of(mode)))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, error, what, max_bytes):
    """The bytes of the regular file at `path`, refused above `max_bytes` before reading."""
    with open_regular(path, error, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise error("%s %s is %d bytes (at most %d)" % (what, ascii(str(path)), size, max_bytes))
        data = f.read(size + 1)
    if len(data) > size:  # it grew while being read
        raise error("%s %s changes while being read" % (what, ascii(str(path))))
    return data


def kind_of(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def check_writable_target(path, error):
    """Refuse an output path that is a symlink or anything but a regular file: writing a temporary
    file and renaming it onto PATH would replace the link or the device node (as root, /dev/full
    becomes a regular file). A path that does not exist yet is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as e:
        raise error("cannot write %s: %s" % (ascii(str(path)), e.strerror or e)) from None
    if not stat.S_ISREG(mode):
        raise error("refusing to write %s: it is %s; give the path of a regular file"
                    % (ascii(str(path)), kind_of(mode)))
    return path
