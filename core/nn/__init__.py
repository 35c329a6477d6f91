"""cn.nn: modules (parameters found from attributes), layers with PyTorch's names and
initialisation, and losses. See module.py for how state is discovered."""

from . import functional
from .module import Module, parameter
from .layers import (Linear, Conv1d, Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, BatchNorm2d, LayerNorm, Dropout,
                     Embedding, ReLU, ReLU6, Hardsigmoid, Hardswish, GELU, Sigmoid, Tanh, Softmax, Flatten,
                     Identity, Sequential, inferred_input_shape)
from .attention import MultiHeadAttention, MultiheadAttention, TransformerEncoderLayer
from .functional import cross_entropy, mse_loss, binary_cross_entropy, binary_cross_entropy_with_logits, nll_loss

__all__ = [
    "functional", "Module", "parameter", "Linear", "Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "BatchNorm2d",
    "LayerNorm", "Dropout", "Embedding", "ReLU", "GELU", "Sigmoid", "Tanh", "Softmax", "Flatten",
    "AdaptiveAvgPool2d", "ReLU6", "Hardsigmoid", "Hardswish", "Identity",
    "Sequential", "inferred_input_shape", "MultiHeadAttention", "MultiheadAttention", "TransformerEncoderLayer",
    "cross_entropy", "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss",
]
