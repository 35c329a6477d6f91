"""torchvision's ResNet-18 and MobileNetV2 written with cinders.nn, with torchvision's state-dict
names, so its checkpoints load directly:

    model = cinders.models.resnet18().eval()     # import cinders.models
    model.load_state_dict(cinders.record.load_pytorch("resnet18-f37072fd.pth"))
    logits = model(images)                       # (N, 3, H, W) -> (N, 1000)
"""
from cinders import nn


def _conv_bn(cin, cout, kernel, stride, groups, backend, activation=True):
    """torchvision's Conv2dNormActivation: conv (no bias) -> BatchNorm2d [-> ReLU6]."""
    layers = [nn.Conv2d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2, groups=groups,
                        bias=False, backend=backend),
              nn.BatchNorm2d(cout, backend=backend)]
    if activation:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN with a shortcut (1x1 conv+BN `downsample` when the shape changes)."""

    def __init__(self, cin, cout, stride=1, backend=None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False, backend=backend)
        self.bn1 = nn.BatchNorm2d(cout, backend=backend)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False, backend=backend)
        self.bn2 = nn.BatchNorm2d(cout, backend=backend)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False, backend=backend),
                                            nn.BatchNorm2d(cout, backend=backend))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """ResNet with BasicBlocks (`layers` blocks per stage: [2, 2, 2, 2] is ResNet-18)."""

    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000, backend=None):
        super().__init__()
        self.layer_counts = list(layers)
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False, backend=backend)
        self.bn1 = nn.BatchNorm2d(64, backend=backend)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = 64
        for i, (count, cout) in enumerate(zip(layers, (64, 128, 256, 512))):
            blocks = []
            for j in range(count):
                blocks.append(BasicBlock(cin, cout, 2 if j == 0 and i > 0 else 1, backend))
                cin = cout
            setattr(self, "layer%d" % (i + 1), nn.Sequential(*blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes, backend=backend)

    def config(self):
        return {"layers": self.layer_counts, "num_classes": self.fc.out_features}

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(num_classes=1000, backend=None):
    return ResNet((2, 2, 2, 2), num_classes, backend)


def _make_divisible(v, divisor=8):
    """torchvision's channel rounding: to a multiple of 8, never below 90% of v."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


class InvertedResidual(nn.Module):
    """[1x1 expand ->] 3x3 depthwise -> 1x1 project, with a shortcut when shapes allow."""

    def __init__(self, cin, cout, stride, expand_ratio, backend=None):
        super().__init__()
        hidden = int(round(cin * expand_ratio))
        self.use_res_connect = stride == 1 and cin == cout
        layers = []
        if expand_ratio != 1:
            layers.append(_conv_bn(cin, hidden, 1, 1, 1, backend))
        layers.append(_conv_bn(hidden, hidden, 3, stride, hidden, backend))
        layers.append(nn.Conv2d(hidden, cout, 1, bias=False, backend=backend))
        layers.append(nn.BatchNorm2d(cout, backend=backend))
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    # (expand ratio, channels, repeats, first stride): torchvision's inverted_residual_setting
    SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
               (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes=1000, width_mult=1.0, dropout=0.2, backend=None):
        super().__init__()
        self.width_mult = width_mult
        cin = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features = [_conv_bn(3, cin, 3, 2, 1, backend)]
        for t, c, n, s in self.SETTING:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t, backend))
                cin = cout
        features.append(_conv_bn(cin, self.last_channel, 1, 1, 1, backend))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes, backend=backend))

    def config(self):
        return {"num_classes": self.classifier[1].out_features, "width_mult": self.width_mult,
                "dropout": self.classifier[0].p}

    def forward(self, x):
        x = self.features(x).mean((2, 3))  # adaptive_avg_pool2d(x, 1) + flatten
        return self.classifier(x)


def mobilenet_v2(num_classes=1000, width_mult=1.0, backend=None):
    return MobileNetV2(num_classes, width_mult, backend=backend)
