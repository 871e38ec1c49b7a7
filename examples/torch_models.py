"""ringgrad's models written in plain PyTorch, with ringgrad's module names, so that state_dicts
move between the two unchanged: ToyNet (layers/models/toynet.cpp, PyTorch's examples/mnist
network) and ResNet-18 with the CIFAR stem (layers/models/resnet.cpp). Used by
check_resnet18_in_pytorch.py and by the benchmark against PyTorch (bench/pytorch/train_bench.py).
Needs only torch."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ToyNet(nn.Module):
    """PyTorch's MNIST example network, as layers/models/toynet.cpp."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = self.downsample(x) if self.downsample is not None else x
        return F.relu(out + identity)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 with the CIFAR stem (3x3 conv, no max pool), as
    layers/models/resnet.cpp."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, in_planes = [], 64
        for i, planes in enumerate([64, 128, 256, 512]):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(in_planes, planes, stride),
                                        BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
