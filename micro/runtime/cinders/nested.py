"""One sample's shape from the input file's nested lists, for a record without input_shape
(and no --input-shape): [[...28 numbers] x 28] is one sample of shape (28, 28). Its own module:
only such inputs pay for compiling it."""
import json


def nested_shape(v):
    """The shape of nested lists (a rectangular JSON value); () for a number."""
    shape = []
    while isinstance(v, list):
        if not v:
            raise ValueError("the input holds an empty list")
        shape.append(len(v))
        v = v[0]
    return tuple(shape)


def shape(path):
    """nested_shape of the JSON file at path."""
    try:
        with open(path) as f:
            v = json.load(f)
    except ValueError:
        raise ValueError("%s is not a JSON list of numbers" % path)
    return nested_shape(v)
