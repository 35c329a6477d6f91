"""A pickle interpreter that runs no code: a fixed set of opcodes, globals resolved against an
allowlist, and every object it builds inert.

`pickle.Unpickler` resolves a GLOBAL by importing the module it names and calls whatever REDUCE,
NEWOBJ, INST, OBJ and BUILD put in front of it; overriding `find_class` narrows that but leaves
the machinery (and its recursion, memo and size behaviour) in charge. This interpreter is the
whole machinery, so what a file can make happen is what is written here:

* Data opcodes of protocols 2-5 (ints, floats, str, bytes, None/bools, tuples, lists, dicts,
  sets, the memo, marks, frames). INST, OBJ, EXT*, the text protocols and out-of-band buffers are
  refused with the opcode and its offset.
* GLOBAL / STACK_GLOBAL go through `allowed`: {"module.name": Allowed(...)}. Anything else is a
  RecordError naming the global; nothing is imported.
* REDUCE calls only `Allowed.call`, NEWOBJ only `Allowed.new`: functions of the caller (the
  PyTorch reader's rebuilders), never the named object. BUILD acts only on objects that define
  `pickle_build(state)` (their own class says what state means).
* BINPERSID hands the persistent id to the caller's `persistent_load`.
* Caps: memo entries, stack and mark depth, LONG sizes; every length is checked against the
  bytes actually present before anything is sliced; the objects built together may cost at
  most MEMORY_FACTOR times the pickle's bytes (plus MEMORY_SLACK), charged per opcode.

Any failure is a RecordError naming what was refused and the byte offset.
"""

import struct

from ..errors import RecordError

MAX_MEMO = 1000000        # memo entries (a checkpoint with 10k tensors uses ~100k)
MAX_STACK = 1000000       # values on the stack at once
MAX_MARKS = 1000          # open MARKs: containers being built inside one another
MAX_LONG_BYTES = 64       # LONG1/LONG4 payload: 512-bit ints are plenty for sizes and ids
MEMORY_FACTOR = 32        # Python objects built may cost this many times the pickle's bytes ...
MEMORY_SLACK = 1 << 20    # ... plus this: a 4 MB pickle of EMPTY_SET opcodes cost 943 MB before
# What building a value costs (bytes, CPython 64-bit, rounded up): charged per opcode against the
# budget above, so the cost of what a file builds is bounded by its size whatever the opcodes.
_COSTS = {b")": 40, b"]": 56, b"}": 64, b"\x8f": 216, b"\x91": 216, b"t": 56, b"\x85": 48, b"\x86": 56,
          b"\x87": 64, b"a": 8, b"e": 8, b"s": 48, b"u": 48, b"\x90": 48, b"X": 56, b"\x8c": 56,
          b"\x8d": 56, b"T": 56, b"U": 56, b"B": 40, b"C": 40, b"\x8e": 40, b"\x96": 64, b"G": 24,
          b"J": 32, b"\x8a": 40, b"\x8b": 40, b"M": 32, b"K": 32, b"R": 64, b"\x81": 64}


class Allowed:
    """What a permitted global may do: `call(*args)` for REDUCE, `new(*args)` for NEWOBJ.
    A global with neither can only be passed around as a value (e.g. a storage type)."""

    def __init__(self, name, call=None, new=None):
        self.name = name
        self.call = call
        self.new = new

    def __repr__(self):
        return "<allowed global %s>" % self.name


class TruncatedPickle(RecordError):
    """The pickle ran past the bytes given (a caller reading a prefix may read more and retry)."""


# opcode byte -> name, for the messages (pickletools' names)
_NAMES = {
    b"(": "MARK", b".": "STOP", b"0": "POP", b"1": "POP_MARK", b"2": "DUP", b"F": "FLOAT", b"I": "INT",
    b"J": "BININT", b"K": "BININT1", b"L": "LONG", b"M": "BININT2", b"N": "NONE", b"P": "PERSID",
    b"Q": "BINPERSID", b"R": "REDUCE", b"S": "STRING", b"T": "BINSTRING", b"U": "SHORT_BINSTRING",
    b"V": "UNICODE", b"X": "BINUNICODE", b"a": "APPEND", b"b": "BUILD", b"c": "GLOBAL", b"d": "DICT",
    b"}": "EMPTY_DICT", b"e": "APPENDS", b"g": "GET", b"h": "BINGET", b"i": "INST", b"j": "LONG_BINGET",
    b"l": "LIST", b"]": "EMPTY_LIST", b"o": "OBJ", b"p": "PUT", b"q": "BINPUT", b"r": "LONG_BINPUT",
    b"s": "SETITEM", b"t": "TUPLE", b")": "EMPTY_TUPLE", b"u": "SETITEMS", b"G": "BINFLOAT",
    b"\x80": "PROTO", b"\x81": "NEWOBJ", b"\x82": "EXT1", b"\x83": "EXT2", b"\x84": "EXT4",
    b"\x85": "TUPLE1", b"\x86": "TUPLE2", b"\x87": "TUPLE3", b"\x88": "NEWTRUE", b"\x89": "NEWFALSE",
    b"\x8a": "LONG1", b"\x8b": "LONG4", b"B": "BINBYTES", b"C": "SHORT_BINBYTES",
    b"\x8c": "SHORT_BINUNICODE", b"\x8d": "BINUNICODE8", b"\x8e": "BINBYTES8", b"\x8f": "EMPTY_SET",
    b"\x90": "ADDITEMS", b"\x91": "FROZENSET", b"\x92": "NEWOBJ_EX", b"\x93": "STACK_GLOBAL",
    b"\x94": "MEMOIZE", b"\x95": "FRAME", b"\x96": "BYTEARRAY8", b"\x97": "NEXT_BUFFER",
    b"\x98": "READONLY_BUFFER",
}

# Refused on purpose (the rest of _NAMES that has no handler is refused as unsupported).
_WHY_REFUSED = {
    "INST": "it imports a class and instantiates it", "OBJ": "it instantiates a class",
    "NEWOBJ_EX": "it instantiates a class with keyword arguments",
    "EXT1": "extension registry codes name code", "EXT2": "extension registry codes name code",
    "EXT4": "extension registry codes name code",
    "NEXT_BUFFER": "out-of-band buffers are not part of a file", "READONLY_BUFFER": "out-of-band buffers",
    "PERSID": "text persistent ids are not written by torch.save",
}


class Unpickler:
    """Run one pickle from `data` (bytes-like) starting at `pos`; `load()` returns the value and
    leaves `self.pos` just after its STOP (legacy torch files are several pickles in a row)."""

    def __init__(self, data, allowed, persistent_load=None, pos=0, what="pickle"):
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.end = len(data)
        self.pos = pos
        self.allowed = allowed
        self.persistent_load = persistent_load
        self.what = what

    # -- reading the byte stream ---------------------------------------------------------------

    def _take(self, n):
        start = self.pos
        if n < 0 or n > self.end - start:
            raise TruncatedPickle("%s is truncated: %d bytes needed at offset %d, %d present"
                              % (self.what, n, start, self.end - start))
        self.pos = start + n
        return self.data[start:start + n]

    def _uint(self, n):
        return int.from_bytes(self._take(n), "little")

    def _line(self):
        data = self.data
        start = self.pos
        stop = bytes(data[start:min(self.end, start + 1024)]).find(b"\n")
        if stop < 0:
            raise RecordError("%s: GLOBAL at offset %d has no end of line within 1024 bytes" % (self.what, start))
        self.pos = start + stop + 1
        return bytes(data[start:start + stop]).decode("utf-8")

    # -- the interpreter -----------------------------------------------------------------------

    def load(self):
        self.stack, self.marks, self.memo = [], [], {}
        stack, data, end, handlers, costs = self.stack, self.data, self.end, _BY_BYTE, _COST_BY_BYTE
        budget = MEMORY_FACTOR * (end - self.pos) + MEMORY_SLACK
        while True:
            at = self.pos
            if at >= end:
                raise TruncatedPickle("%s is truncated: no STOP before offset %d" % (self.what, at))
            code = data[at]
            self.pos = at + 1
            handler = handlers[code]
            if handler is None:
                self._refuse(bytes((code,)), at)
            budget -= costs[code]
            if budget < 0:
                raise RecordError("%s: the values it builds would cost more than %d times its %d bytes "
                                  "(offset %d)" % (self.what, MEMORY_FACTOR, end, at))
            try:
                if handler(self):
                    break
            except RecordError:
                raise
            except (IndexError, KeyError, TypeError, ValueError, AttributeError, OverflowError,
                    RecursionError, struct.error) as e:
                raise RecordError("%s: malformed at offset %d (opcode %s): %s"
                                  % (self.what, at, _NAMES.get(bytes((code,)), "%02x" % code), _short(e))) from None
            if len(stack) > MAX_STACK:
                raise RecordError("%s: more than %d values on the stack at offset %d" % (self.what, MAX_STACK, at))
        if len(self.stack) != 1 or self.marks:
            raise RecordError("%s: STOP at offset %d leaves %d values and %d marks (need one value)"
                              % (self.what, self.pos - 1, len(self.stack), len(self.marks)))
        return self.stack.pop()

    def _refuse(self, code, at):
        name = _NAMES.get(code)
        if name is None:
            raise RecordError("%s: unknown opcode 0x%s at offset %d" % (self.what, code.hex(), at))
        why = _WHY_REFUSED.get(name, "only protocols 2-5 binary opcodes are read")
        raise RecordError("%s: refused opcode %s at offset %d (%s)" % (self.what, name, at, why))

    def _pop_mark(self):
        if not self.marks:
            raise RecordError("%s: opcode at offset %d needs a MARK and none is open" % (self.what, self.pos - 1))
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def _resolve(self, module, name):
        full = module + "." + name
        allowed = self.allowed.get(full)
        if allowed is None:
            raise RecordError("%s: refused global %s (offset %d): only %s may be named; nothing was "
                              "imported or called" % (self.what, full, self.pos, ", ".join(sorted(self.allowed))))
        return allowed

    def _put(self, key, value):
        if key not in self.memo and len(self.memo) >= MAX_MEMO:
            raise RecordError("%s: more than %d memo entries at offset %d" % (self.what, MAX_MEMO, self.pos))
        self.memo[key] = value

    def _get(self, key):
        try:
            return self.memo[key]
        except KeyError:
            raise RecordError("%s: memo entry %d read before written (offset %d)"
                              % (self.what, key, self.pos)) from None

    def _str(self, n):
        try:
            return str(self._take(n), "utf-8", "surrogatepass")
        except UnicodeDecodeError:
            raise RecordError("%s: invalid UTF-8 string at offset %d" % (self.what, self.pos - n)) from None

    def _long(self, n):
        if n > MAX_LONG_BYTES:
            raise RecordError("%s: a %d-byte integer at offset %d (at most %d)"
                              % (self.what, n, self.pos, MAX_LONG_BYTES))
        return int.from_bytes(self._take(n), "little", signed=True)


def _short(e):
    text = str(e)
    return text if len(text) < 200 else text[:200] + "..."


# -- opcode handlers: each returns True only at STOP -------------------------------------------

def _push(value):
    return lambda u: u.stack.append(value)


def _proto(u):
    version = u._uint(1)
    if not 2 <= version <= 5:
        raise RecordError("%s: pickle protocol %d at offset %d (protocols 2-5 are read)" % (u.what, version, u.pos - 2))


def _frame(u):
    u._uint(8)  # frames only group opcodes; the lengths need no trust since every read is checked


def _mark(u):
    if len(u.marks) >= MAX_MARKS:
        raise RecordError("%s: more than %d nested MARKs at offset %d" % (u.what, MAX_MARKS, u.pos - 1))
    u.marks.append(len(u.stack))


def _pop(u):
    if u.marks and u.marks[-1] == len(u.stack):
        u.marks.pop()
    else:
        u.stack.pop()


_SCALARS = (str, bytes, int, float, bool, type(None))


def hashable(value, what="pickle"):
    """`value` if it may be a dict key or set member: a scalar or a flat tuple of scalars. Hashing
    is recursive in C with no depth check (a tuple nested a million deep crashes CPython), and
    state dicts only ever use str and int keys."""
    if isinstance(value, _SCALARS) or (isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value)):
        return value
    raise RecordError("%s: a %s as a dict key or set member (only str, bytes, numbers, None and flat tuples "
                      "of them)" % (what, type(value).__name__))


def _setitems(u):
    items = u._pop_mark()
    target = u.stack[-1]
    if not isinstance(target, dict) or len(items) % 2:
        raise RecordError("%s: SETITEMS on %s with %d items (offset %d)"
                          % (u.what, type(target).__name__, len(items), u.pos - 1))
    for i in range(0, len(items), 2):
        target[hashable(items[i], u.what)] = items[i + 1]


def _setitem(u):
    value = u.stack.pop()
    key = u.stack.pop()
    target = u.stack[-1]
    if not isinstance(target, dict):
        raise RecordError("%s: SETITEM on %s (offset %d)" % (u.what, type(target).__name__, u.pos - 1))
    target[hashable(key, u.what)] = value


def _appends(u):
    items = u._pop_mark()
    target = u.stack[-1]
    if not isinstance(target, list):
        raise RecordError("%s: APPENDS on %s (offset %d)" % (u.what, type(target).__name__, u.pos - 1))
    target.extend(items)


def _append(u):
    value = u.stack.pop()
    target = u.stack[-1]
    if not isinstance(target, list):
        raise RecordError("%s: APPEND on %s (offset %d)" % (u.what, type(target).__name__, u.pos - 1))
    target.append(value)


def _additems(u):
    items = u._pop_mark()
    target = u.stack[-1]
    if not isinstance(target, set):
        raise RecordError("%s: ADDITEMS on %s (offset %d)" % (u.what, type(target).__name__, u.pos - 1))
    target.update(hashable(v, u.what) for v in items)


def _global(u):
    module = u._line()
    name = u._line()
    u.stack.append(u._resolve(module, name))


def _stack_global(u):
    name = u.stack.pop()
    module = u.stack.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise RecordError("%s: STACK_GLOBAL needs two strings (offset %d)" % (u.what, u.pos - 1))
    u.stack.append(u._resolve(module, name))


def _reduce(u):
    args = u.stack.pop()
    target = u.stack.pop()
    if not isinstance(target, Allowed) or target.call is None or not isinstance(args, tuple):
        raise RecordError("%s: refused REDUCE on %s at offset %d (only allowlisted functions are called)"
                          % (u.what, _describe(target), u.pos - 1))
    u.stack.append(target.call(*args))


def _newobj(u):
    args = u.stack.pop()
    cls = u.stack.pop()
    if not isinstance(cls, Allowed) or cls.new is None or not isinstance(args, tuple):
        raise RecordError("%s: refused NEWOBJ of %s at offset %d" % (u.what, _describe(cls), u.pos - 1))
    u.stack.append(cls.new(*args))


def _build(u):
    state = u.stack.pop()
    target = u.stack[-1]
    build = getattr(type(target), "pickle_build", None)
    if build is None:
        raise RecordError("%s: refused BUILD on %s at offset %d" % (u.what, _describe(target), u.pos - 1))
    build(target, state)


def _binpersid(u):
    pid = u.stack.pop()
    if u.persistent_load is None:
        raise RecordError("%s: persistent id at offset %d, but this file has no storages" % (u.what, u.pos - 1))
    u.stack.append(u.persistent_load(pid))


def _tuple_n(n):
    def handler(u):
        if len(u.stack) < n:
            raise RecordError("%s: TUPLE%d with %d values on the stack (offset %d)"
                              % (u.what, n, len(u.stack), u.pos - 1))
        items = tuple(u.stack[len(u.stack) - n:])
        del u.stack[len(u.stack) - n:]
        u.stack.append(items)
    return handler


def _stop(u):
    return True


def _describe(value):
    if isinstance(value, Allowed):
        return value.name
    return "a value of type %s" % type(value).__name__


_HANDLERS = {
    b"\x80": _proto,
    b"\x95": _frame,
    b".": _stop,
    b"(": _mark,
    b"0": _pop,
    b"1": lambda u: u._pop_mark(),
    b"2": lambda u: u.stack.append(u.stack[-1]),
    b"N": _push(None),
    b"\x88": _push(True),
    b"\x89": _push(False),
    b"J": lambda u: u.stack.append(int.from_bytes(u._take(4), "little", signed=True)),
    b"K": lambda u: u.stack.append(u._uint(1)),
    b"M": lambda u: u.stack.append(u._uint(2)),
    b"\x8a": lambda u: u.stack.append(u._long(u._uint(1))),
    b"\x8b": lambda u: u.stack.append(u._long(u._uint(4))),
    b"G": lambda u: u.stack.append(struct.unpack(">d", u._take(8))[0]),
    b"X": lambda u: u.stack.append(u._str(u._uint(4))),
    b"\x8c": lambda u: u.stack.append(u._str(u._uint(1))),
    b"\x8d": lambda u: u.stack.append(u._str(u._uint(8))),
    b"T": lambda u: u.stack.append(str(u._take(u._uint(4)), "latin-1")),  # Python 2 str
    b"U": lambda u: u.stack.append(str(u._take(u._uint(1)), "latin-1")),
    b"B": lambda u: u.stack.append(bytes(u._take(u._uint(4)))),
    b"C": lambda u: u.stack.append(bytes(u._take(u._uint(1)))),
    b"\x8e": lambda u: u.stack.append(bytes(u._take(u._uint(8)))),
    b"\x96": lambda u: u.stack.append(bytearray(u._take(u._uint(8)))),
    b")": lambda u: u.stack.append(()),
    b"]": lambda u: u.stack.append([]),
    b"}": lambda u: u.stack.append({}),
    b"\x8f": lambda u: u.stack.append(set()),
    b"t": lambda u: u.stack.append(tuple(u._pop_mark())),
    b"\x85": _tuple_n(1),
    b"\x86": _tuple_n(2),
    b"\x87": _tuple_n(3),
    b"\x91": lambda u: u.stack.append(frozenset(hashable(v, u.what) for v in u._pop_mark())),
    b"a": _append,
    b"e": _appends,
    b"s": _setitem,
    b"u": _setitems,
    b"\x90": _additems,
    b"q": lambda u: u._put(u._uint(1), u.stack[-1]),
    b"r": lambda u: u._put(u._uint(4), u.stack[-1]),
    b"\x94": lambda u: u._put(len(u.memo), u.stack[-1]),
    b"h": lambda u: u.stack.append(u._get(u._uint(1))),
    b"j": lambda u: u.stack.append(u._get(u._uint(4))),
    b"c": _global,
    b"\x93": _stack_global,
    b"R": _reduce,
    b"\x81": _newobj,
    b"b": _build,
    b"Q": _binpersid,
}

_BY_BYTE = [_HANDLERS.get(bytes((i,))) for i in range(256)]
_COST_BY_BYTE = [_COSTS.get(bytes((i,)), 0) for i in range(256)]
