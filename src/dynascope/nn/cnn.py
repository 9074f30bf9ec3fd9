"""Small CNN of the permuted-initialisations study (SYSTEMS.md S7): bias-free 3×3 convolutions.

Glossary:
    batch:         images per batch.
    in_channels:   input channels (digits: 1).
    image_size:    input height = width (digits: 8).
    arch:          a string of tokens joined by ``-``: an integer k is a 3×3 convolution to k
                   channels (padding 1, stride 1) followed by ReLU; ``avg`` is a 2×2 average
                   pool (halves height and width). E.g. ``32-32-avg-64-64`` (S7's fast CNN) or
                   ``64-avg-128-avg-256``.
    features.i:    ``nn.Conv2d``; ``weight`` ``[C_out, C_in, 3, 3]`` (torch layout: output
                   channels on axis 0, input channels on axis 1), ``bias`` ``[C_out]`` only with
                   ``use_bias=True``.
    readout:       ``nn.Linear(C_last, d_out)`` on the global average of the last feature map.

Forward::

    h = features(x)            # [batch, C_last, image_size / 2^n_avg, image_size / 2^n_avg]
    h = h.mean(dim=(-2, -1))   # [batch, C_last]   global average pool (keeps channel order)
    logits = readout(h)        # [batch, d_out]

Average pools act channel by channel, so permuting the channels of a convolution's output
(and the matching input channels of the next layer, the readout's inputs after the last
convolution) leaves the function unchanged; :mod:`dynascope.probes.permutation` relies on it.

Initialisation (reference code's ``MyConv2d`` / ``MyLinear``): every weight ``~ N(0, 2 /
fan_in)`` with ``fan_in = C_in · 9`` for a convolution and ``C_last`` for the readout; biases
zero. No BatchNorm (S7's default: off).

References:
    Benzing et al. (2022), "Random initialisations performing above chance and how to find
    them", OPT 2022, arXiv 2209.07509, Sec. 3 (``SimpleCNN`` of freedbee/permuted_initialisations).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .permutation_nets import _check_width, kaiming_normal_

__all__ = ["SimpleCNN", "parse_cnn_arch"]


def parse_cnn_arch(arch: str) -> list[int | str]:
    """Tokens of ``arch``: channel counts (``int``) and ``"avg"``.

    Raises:
        ValueError: if a token is neither a positive integer nor ``avg``, or there is no
            convolution.
    """
    tokens: list[int | str] = []
    for token in arch.split("-"):
        if token == "avg":
            tokens.append(token)
        elif token.isdigit() and int(token) >= 1:
            tokens.append(int(token))
        else:
            raise ValueError(
                f"arch tokens must be positive integers or 'avg' joined by '-' "
                f"(got arch={arch!r}, token {token!r})"
            )
    if not any(isinstance(t, int) for t in tokens):
        raise ValueError(f"arch must hold at least one convolution (got arch={arch!r})")
    return tokens


class SimpleCNN(nn.Module):
    """Conv3×3+ReLU stacks with 2×2 average pools, global average pool, linear readout.

    Args:
        arch: layer string (see the module docstring), e.g. ``"32-32-avg-64-64"``.
        in_channels: input channels (> 0).
        image_size: input height and width (> 0); each ``avg`` needs it even at that point.
        d_out: classes (> 0).
        use_bias: give every convolution and the readout a bias (zero-initialised).
        generator: source of the initial weights (``None``: torch's global generator).
    Raises:
        ValueError: for a malformed ``arch``, a non-positive size, or a pool on an odd size.
    """

    def __init__(
        self,
        arch: str = "64-64-avg-128-128",
        *,
        in_channels: int = 1,
        image_size: int = 8,
        d_out: int = 10,
        use_bias: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("image_size", image_size)):
            _check_width(name, value)
        _check_width("d_out", d_out)
        tokens = parse_cnn_arch(arch)
        self.arch, self.in_channels, self.image_size = arch, in_channels, image_size
        self.d_out, self.use_bias = d_out, use_bias
        modules: list[nn.Module] = []
        channels, size = in_channels, image_size
        for token in tokens:
            if token == "avg":
                if size % 2:
                    raise ValueError(
                        f"arch {arch!r}: an 'avg' pool needs an even map size (got {size} "
                        f"from image_size={image_size})"
                    )
                modules.append(nn.AvgPool2d(2))
                size //= 2
            else:
                conv = nn.Conv2d(channels, int(token), 3, padding=1, bias=use_bias)
                kaiming_normal_(conv.weight, generator)
                if conv.bias is not None:
                    nn.init.zeros_(conv.bias)
                modules += [conv, nn.ReLU()]
                channels = int(token)
        self.features = nn.Sequential(*modules)
        self.readout = nn.Linear(channels, d_out, bias=use_bias)
        kaiming_normal_(self.readout.weight, generator)
        if self.readout.bias is not None:
            nn.init.zeros_(self.readout.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``[batch, d_out]`` for images ``x`` ``[batch, in_channels, size, size]``.

        Raises:
            ValueError: if ``x`` is not ``[batch, in_channels, image_size, image_size]``.
        """
        expected = (self.in_channels, self.image_size, self.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(
                f"x must be [batch, {', '.join(map(str, expected))}] (got x.shape={list(x.shape)})"
            )
        h = self.features(x)  # [batch, C_last, s, s]
        return self.readout(h.mean(dim=(-2, -1)))  # [batch, d_out]

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, image_size={self.image_size}, use_bias={self.use_bias}"
