"""``resnet18`` and ``resnet18-gn``: ResNet-18 for 32x32 inputs, with BatchNorm or with GroupNorm.

The CIFAR form of ResNet-18 (He et al., 2016; the form most FL papers train on CIFAR):
a 3x3 stem with stride 1 and no max-pool, then four stages of two torchvision
``BasicBlock`` each (64, 128, 256, 512 channels; strides 1, 2, 2, 2), global average
pooling and the classifier (11.2 M parameters on CIFAR-10). The blocks are torchvision's
own, given the normalisation layer. ``resnet18-gn`` replaces every BatchNorm with
GroupNorm of 2 groups, the usual fix for BatchNorm under non-IID data (Hsieh et al.,
"The Non-IID Data Quagmire of Decentralized Machine Learning", ICML 2020).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from clients.models.split import SplitModel

WIDTHS = (64, 128, 256, 512)
GROUPS = 2  # GroupNorm's groups (Hsieh et al. 2020)


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with :data:`GROUPS` groups over ``channels``."""
    return nn.GroupNorm(GROUPS, channels)


class ResNet18(SplitModel):
    """ResNet-18 with a 3x3 stride-1 stem (32x32 inputs); the representation is the pooled 512-d features."""

    head_prefix = "fc"

    def __init__(self, *, in_channels: int, num_classes: int, norm_layer: Callable[[int], nn.Module]) -> None:
        # imported here: a deployed device imports this module in every message, and torchvision costs seconds
        from torchvision.models.resnet import BasicBlock

        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, WIDTHS[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = norm_layer(WIDTHS[0])
        self.relu = nn.ReLU(inplace=True)
        stages, inplanes = [], WIDTHS[0]
        for index, planes in enumerate(WIDTHS):
            stride = 1 if index == 0 else 2
            downsample = None
            if stride != 1 or inplanes != planes:
                shortcut = nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False)
                downsample = nn.Sequential(shortcut, norm_layer(planes))
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride, downsample, norm_layer=norm_layer),
                                        BasicBlock(planes, planes, norm_layer=norm_layer)))  # fmt: skip
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(WIDTHS[-1], num_classes)
        for module in self.modules():  # torchvision's ResNet initialisation
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d | nn.GroupNorm):
                nn.init.constant_(module.weight, 1)
                nn.init.constant_(module.bias, 0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc(z)


def channels_of(input_shape: tuple[int, ...], name: str) -> int:
    """The channels of an image shape (C, H, W).

    Raises
    ------
    ValueError
        If ``input_shape`` is not (C, H, W) with both sides at least 8 (three stride-2 stages).

    """
    if len(input_shape) != 3 or min(input_shape[1:]) < 8:
        raise ValueError(f"model {name!r} needs images (C, H, W) at least 8x8, got input shape {input_shape}")
    return input_shape[0]


def build_resnet18(input_shape: tuple[int, ...], num_classes: int) -> ResNet18:
    """ResNet-18 with BatchNorm."""
    return ResNet18(in_channels=channels_of(input_shape, "resnet18"), num_classes=num_classes,
                    norm_layer=nn.BatchNorm2d)  # fmt: skip


def build_resnet18_gn(input_shape: tuple[int, ...], num_classes: int) -> ResNet18:
    """ResNet-18 with GroupNorm (2 groups) in place of every BatchNorm."""
    return ResNet18(in_channels=channels_of(input_shape, "resnet18-gn"), num_classes=num_classes,
                    norm_layer=group_norm)  # fmt: skip
