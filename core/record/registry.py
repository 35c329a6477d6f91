"""Which model classes a record may name: a registry, never an import.

A record's metadata says `model_class: "cinders.models.mnist.MnistCNN"`. That string only ever
*selects* among classes the program already trusts:
* Cinders' own model classes (the layers of `cinders.nn`, the models of `cinders.models`): the
  modules of those two packages, listed by this code, never taken from the file;
* classes the program registered with `cn.register_model(cls)` (also a class decorator);
* classes the caller passes for this one load (`allow=[Net]`, or `cls=` through `Net.load(path)`);
  a module in `allow` stands for every `nn.Module` subclass defined in it.
Nothing is imported, called or looked up by attribute because a file names it. Both
`cn.load_model` and `cinders export-micro` resolve through `resolve_class`, so there is one rule.
"""

import importlib
import pkgutil
import threading
import types

from ..errors import RecordError

# Cinders' own packages whose nn.Module classes records may name: every module in them (found
# in the installed package's folder by this code, never from a file).
OWN_PACKAGES = ("cinders.nn", "cinders.models")

_registered = {}
_lock = threading.Lock()


def class_path(cls):
    return cls.__module__ + "." + cls.__qualname__


def register_model(cls):
    """Let records name `cls` (returns it, so it works as a class decorator):

        @cn.register_model
        class Net(cn.nn.Module): ...
    """
    from ..nn import Module
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError("register_model: %r is not a cinders.nn.Module subclass" % (cls,))
    with _lock:
        _registered[class_path(cls)] = cls
    return cls


def _module_classes(module):
    from ..nn import Module
    return [v for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, Module) and v.__module__ == module.__name__]


def own_modules():
    """Names of the modules of OWN_PACKAGES (their submodules, one level)."""
    names = []
    for package in OWN_PACKAGES:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            names.append(package + "." + info.name)
    return names


def own_classes():
    """{dotted name: class} of Cinders' own model classes."""
    found = {}
    for name in own_modules():
        for cls in _module_classes(importlib.import_module(name)):
            found[class_path(cls)] = cls
    return found


def _trusted(allow):
    """{dotted name: class} of what the caller allowed plus what the program registered."""
    from ..nn import Module
    found = {}
    for entry in allow or ():
        if isinstance(entry, type) and issubclass(entry, Module):
            found[class_path(entry)] = entry
        elif isinstance(entry, types.ModuleType):
            for cls in _module_classes(entry):
                found[class_path(cls)] = cls
        else:
            raise TypeError("allow= takes nn.Module classes or modules, not %r (names are never "
                            "imported: import the class yourself and pass it)" % (entry,))
    with _lock:
        for name, cls in _registered.items():
            found.setdefault(name, cls)
    return found


HOW_TO_ALLOW = ("pass the class (allow=[TheClass], or TheClass.load(path)) or register it with "
                "cn.register_model(TheClass)")


def resolve_class(name, allow=(), where="the record", how=HOW_TO_ALLOW):
    """The class a record's `model_class` names, found only among trusted classes.

    Exact dotted name first (allowed, registered, Cinders' own); otherwise the one allowed or
    registered class with that class name (a model saved from `__main__.Net` and loaded where
    Net lives in `net.py`). Raises RecordError saying how to allow the class (`how`).
    """
    if not isinstance(name, str) or not name:
        raise RecordError("%s: model_class %r is not a class name" % (where, name))
    trusted = _trusted(allow)
    cls = trusted.get(name) or own_classes().get(name)
    if cls is not None:
        return cls
    short = name.rpartition(".")[2]
    same = [c for c in trusted.values() if c.__qualname__ == short]
    if len(same) == 1:
        return same[0]
    raise RecordError(
        "%s names model class %r, which is not a Cinders model and was not allowed: %s; records "
        "never import code" % (where, name, how))
