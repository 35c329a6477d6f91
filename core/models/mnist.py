"""The MNIST models of the demos and benchmarks (the same layers as PyTorch's plain recipe).

Records name the class and its config in their metadata, so `cinders predict/eval/export-micro`
rebuild the model from the file alone.
"""
from cinders import nn


class MnistMLP(nn.Module):
    """Flatten -> Linear(784, hidden) -> ReLU -> Linear(hidden, 10)."""

    input_shape = (1, 28, 28)  # one sample (exporters read it: the committed records predate it)
    input_range = (0.0, 1.0)   # pixels as trained; `cinders predict` refuses others

    def __init__(self, hidden=128):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def config(self):
        return {"hidden": self.layers[1].out_features}

    def forward(self, x):
        return self.layers(x)


class MnistCNN(nn.Module):
    """conv16 -> pool -> conv32 -> pool -> fc128 -> fc10, 3x3 convolutions with padding 1."""

    input_shape = (1, 28, 28)
    input_range = (0.0, 1.0)

    def __init__(self, channels1=16, channels2=32, hidden=128):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(1, channels1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels1, channels2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(channels2 * 7 * 7, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def config(self):
        return {"channels1": self.layers[0].out_channels, "channels2": self.layers[3].out_channels,
                "hidden": self.layers[7].out_features}

    def forward(self, x):
        return self.layers(x)
