"""Small models on generated data: `mlp` (regression on a fixed random teacher) and
`cnn` (classification of generated images by a fixed random teacher).

Data are generated once from a seeded `torch.Generator`, so the same `seed` always
gives the same samples and targets, whatever the global RNG state.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class TensorPairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """(x[i], y[i]) pairs held in memory."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class MLP(nn.Module):
    """`depth` Linear+GELU layers of width `hidden`, then a linear head."""

    def __init__(self, *, in_features: int, hidden: int, depth: int, out_features: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def teacher_regression(
    *, samples: int, in_features: int, out_features: int, seed: int
) -> TensorPairs:
    """x ~ N(0, 1); y = tanh(x W1) W2 + small noise, with W1, W2 drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, in_features, generator=g)
    w1 = torch.randn(in_features, 64, generator=g) / in_features**0.5
    w2 = torch.randn(64, out_features, generator=g) / 8.0
    y = torch.tanh(x @ w1) @ w2 + 0.01 * torch.randn(samples, out_features, generator=g)
    return TensorPairs(x, y)


class SmallCNN(nn.Module):
    """Two conv blocks (conv, ReLU, max-pool) and a linear classifier."""

    def __init__(self, *, channels: int = 16, image_size: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(2 * channels * (image_size // 4) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def teacher_images(*, samples: int, image_size: int, classes: int, seed: int) -> TensorPairs:
    """Smoothed noise images labelled by a fixed random linear teacher (argmax)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 1, image_size, image_size, generator=g)
    x = nn.functional.avg_pool2d(x, 3, stride=1, padding=1)
    w = torch.randn(image_size * image_size, classes, generator=g)
    y = (x.flatten(1) @ w).argmax(dim=1)
    return TensorPairs(x, y)
