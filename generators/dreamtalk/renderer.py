"""The image generator: warps and refines a portrait to follow face-model coefficients.

A PIRenderer-type network in three parts:

* ``mapping_net``: a window of ``2 * radius + 1`` frames of coefficients (expression +
  pose) -> one motion descriptor, by dilated 1-D convolutions and average pooling;
* ``warpping_net`` (sic, the checkpoint's spelling): an hourglass whose normalisation is
  modulated by the descriptor (AdaIN) predicts a flow field, which warps the portrait;
* ``editing_net``: an encoder-decoder over portrait + warped image, again modulated by
  the descriptor, paints the final frame.

Module and parameter names follow ``renderer.pt`` (``net_G_ema``) exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DreamTalkConfig

_SLOPE = 0.1
"""Negative slope of every LeakyReLU in the renderer."""


def _act() -> nn.Module:
    return nn.LeakyReLU(_SLOPE)


class LayerNorm2d(nn.Module):
    """LayerNorm over channels and space together, with a per-channel scale and shift
    (``weight``/``bias`` of shape ``(C, 1, 1)``)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels, 1, 1))
        self.bias = nn.Parameter(torch.zeros(channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[1:]) * self.weight + self.bias


class AdaIN(nn.Module):
    """Instance norm whose scale and shift come from the motion descriptor:
    ``norm(x) * (1 + gamma(z)) + beta(z)``. Names: ``mlp_shared.0``, ``mlp_gamma``,
    ``mlp_beta``."""

    def __init__(self, channels: int, descriptor_dim: int, hidden: int):
        super().__init__()
        self.mlp_shared = nn.Sequential(nn.Linear(descriptor_dim, hidden), nn.ReLU())
        self.mlp_gamma = nn.Linear(hidden, channels)
        self.mlp_beta = nn.Linear(hidden, channels)

    def forward(self, x: torch.Tensor, descriptor: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)``, ``(B, D)`` -> ``(B, C, H, W)``."""
        shared = self.mlp_shared(descriptor)
        gamma = self.mlp_gamma(shared)[..., None, None]
        beta = self.mlp_beta(shared)[..., None, None]
        return F.instance_norm(x) * (1 + gamma) + beta


# ------------------------------------------------------------------------ mapping
class MappingNet(nn.Module):
    """``(B, coeff_dim + pose_dim, 2r + 1)`` coefficient windows -> ``(B, descriptor_dim)``.

    A kernel-7 convolution, then residual dilated convolutions (kernel 3, dilation 3), each
    shortening the window by 6 frames (the residual is centre-cropped to match), then the
    mean over what is left. Names: ``first.0``, ``encoder{i}.1``.
    """

    def __init__(self, coeff_nc: int, descriptor_nc: int, layers: int):
        super().__init__()
        self.layers = layers
        self.first = nn.Sequential(nn.Conv1d(coeff_nc, descriptor_nc, kernel_size=7))
        for i in range(layers):
            self.add_module(f"encoder{i}", nn.Sequential(_act(), nn.Conv1d(descriptor_nc, descriptor_nc, 3, dilation=3)))

    def forward(self, windows: torch.Tensor) -> torch.Tensor:
        out = self.first(windows)
        for i in range(self.layers):
            out = getattr(self, f"encoder{i}")(out) + out[:, :, 3:-3]
        return out.mean(dim=-1)


# ------------------------------------------------------------------------ warping
class _AdaINDownBlock(nn.Module):
    """AdaIN -> act -> stride-2 conv (k4), AdaIN -> act -> conv (k3)."""

    def __init__(self, n_in: int, n_out: int, descriptor_dim: int, hidden: int):
        super().__init__()
        self.conv_0 = nn.Conv2d(n_in, n_out, kernel_size=4, stride=2, padding=1)
        self.conv_1 = nn.Conv2d(n_out, n_out, kernel_size=3, padding=1)
        self.norm_0 = AdaIN(n_in, descriptor_dim, hidden)
        self.norm_1 = AdaIN(n_out, descriptor_dim, hidden)
        self.actvn = _act()

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x = self.conv_0(self.actvn(self.norm_0(x, z)))
        return self.conv_1(self.actvn(self.norm_1(x, z)))


class _AdaINUpBlock(nn.Module):
    """Residual upsampling: AdaIN/act/conv then AdaIN/act/transposed conv (x2), plus an
    AdaIN/act/transposed-conv shortcut."""

    def __init__(self, n_in: int, n_out: int, descriptor_dim: int, hidden: int):
        super().__init__()
        up = dict(kernel_size=3, stride=2, padding=1, output_padding=1)
        self.conv_0 = nn.Conv2d(n_in, n_out, kernel_size=3, padding=1)
        self.conv_1 = nn.ConvTranspose2d(n_out, n_out, **up)
        self.conv_s = nn.ConvTranspose2d(n_in, n_out, **up)
        self.norm_0 = AdaIN(n_in, descriptor_dim, hidden)
        self.norm_1 = AdaIN(n_out, descriptor_dim, hidden)
        self.norm_s = AdaIN(n_in, descriptor_dim, hidden)
        self.actvn = _act()

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        shortcut = self.conv_s(self.actvn(self.norm_s(x, z)))
        dx = self.conv_0(self.actvn(self.norm_0(x, z)))
        return shortcut + self.conv_1(self.actvn(self.norm_1(dx, z)))


class _HourglassEncoder(nn.Module):
    """Names: ``input_layer`` (k7 conv), ``encoder{i}`` (down blocks)."""

    def __init__(self, image_nc: int, base: int, max_nc: int, layers: int, descriptor_dim: int, hidden: int):
        super().__init__()
        self.layers = layers
        self.input_layer = nn.Conv2d(image_nc, base, kernel_size=7, padding=3)
        for i in range(layers):
            n_in, n_out = min(base * 2**i, max_nc), min(base * 2 ** (i + 1), max_nc)
            self.add_module(f"encoder{i}", _AdaINDownBlock(n_in, n_out, descriptor_dim, hidden))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> list:
        """Features at every scale, finest first."""
        out = [self.input_layer(x)]
        for i in range(self.layers):
            out.append(getattr(self, f"encoder{i}")(out[-1], z))
        return out


class _HourglassDecoder(nn.Module):
    """The ``decoder_layers`` coarsest scales back up, each concatenated with the skip of
    its scale. Names: ``decoder{i}`` for ``i`` from ``encoder_layers - 1`` down."""

    def __init__(self, base: int, max_nc: int, encoder_layers: int, decoder_layers: int, descriptor_dim: int, hidden: int):
        super().__init__()
        self.levels = list(range(encoder_layers - decoder_layers, encoder_layers))[::-1]
        for i in self.levels:
            n_in = min(base * 2 ** (i + 1), max_nc)
            if i != encoder_layers - 1:
                n_in *= 2  # concatenated skip
            n_out = min(base * 2**i, max_nc)
            self.add_module(f"decoder{i}", _AdaINUpBlock(n_in, n_out, descriptor_dim, hidden))
        self.output_nc = 2 * n_out

    def forward(self, features: list, z: torch.Tensor) -> torch.Tensor:
        features = list(features)
        out = features.pop()
        for i in self.levels:
            out = torch.cat([getattr(self, f"decoder{i}")(out, z), features.pop()], dim=1)
        return out


class _Hourglass(nn.Module):
    def __init__(self, image_nc, descriptor_dim, base, max_nc, encoder_layers, decoder_layers, hidden):
        super().__init__()
        self.encoder = _HourglassEncoder(image_nc, base, max_nc, encoder_layers, descriptor_dim, hidden)
        self.decoder = _HourglassDecoder(base, max_nc, encoder_layers, decoder_layers, descriptor_dim, hidden)
        self.output_nc = self.decoder.output_nc

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x, z), z)


def warp(image: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
    """Warp ``(B, C, H, W)`` ``image`` by a ``(B, 2, h, w)`` flow in pixels of the flow's own
    grid (x then y); the sampling grid is upsampled to the image size first."""
    batch, _, h, w = flow.shape
    ys = torch.linspace(-1, 1, h, device=flow.device, dtype=flow.dtype)
    xs = torch.linspace(-1, 1, w, device=flow.device, dtype=flow.dtype)
    grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)  # (h, w, 2) as (x, y)
    scale = torch.tensor([2.0 / (w - 1), 2.0 / (h - 1)], device=flow.device, dtype=flow.dtype)
    deformation = grid + flow.permute(0, 2, 3, 1) * scale  # (B, h, w, 2)
    if (h, w) != tuple(image.shape[-2:]):
        deformation = F.interpolate(
            deformation.permute(0, 3, 1, 2), size=image.shape[-2:], mode="bilinear", align_corners=False
        )
        deformation = deformation.permute(0, 2, 3, 1)
    return F.grid_sample(image, deformation, mode="bilinear", padding_mode="zeros", align_corners=False)


class WarpingNet(nn.Module):
    """Names: ``hourglass.*``, ``flow_out`` (LayerNorm2d, act, k7 conv to 2 channels)."""

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        self.hourglass = _Hourglass(
            config.image_channels, config.descriptor_dim, config.warp_base_channels, config.max_channels,
            config.warp_encoder_layers, config.warp_decoder_layers, config.adain_hidden,
        )
        channels = self.hourglass.output_nc
        self.flow_out = nn.Sequential(LayerNorm2d(channels), _act(), nn.Conv2d(channels, 2, kernel_size=7, padding=3))

    def forward(self, image: torch.Tensor, descriptor: torch.Tensor) -> torch.Tensor:
        """``(B, 3, S, S)``, ``(B, D)`` -> warped ``(B, 3, S, S)``."""
        flow = self.flow_out(self.hourglass(image, descriptor))
        return warp(image, flow)


# ------------------------------------------------------------------------ editing
def _conv_norm_act(n_in: int, n_out: int, kernel: int, *extra: nn.Module) -> nn.Sequential:
    """``model`` Sequential of conv, LayerNorm2d, act (+ extra), as the checkpoint nests it."""
    return nn.Sequential(nn.Conv2d(n_in, n_out, kernel, padding=kernel // 2), LayerNorm2d(n_out), _act(), *extra)


class _Block(nn.Module):
    """Holds its layers under ``model`` (checkpoint nesting)."""

    def __init__(self, model: nn.Sequential):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class _UpBlock(_Block):
    """Nearest-neighbour x2, then conv/norm/act."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(F.interpolate(x, scale_factor=2, mode="nearest"))


class _AdaINResBlock(nn.Module):
    """Residual block modulated by the descriptor.

    The published block computes ``norm1(conv1(x))`` and then overwrites it, so its output
    is ``x + norm2(conv2(x), z)``: ``conv1``/``norm1`` are in the checkpoint but do not
    reach the image. That computation is reproduced here, without the dead branch.
    """

    def __init__(self, channels: int, descriptor_dim: int, hidden: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.norm1 = AdaIN(channels, descriptor_dim, hidden)
        self.norm2 = AdaIN(channels, descriptor_dim, hidden)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x + self.norm2(self.conv2(x), z)


class _AdaINResBlocks(nn.Module):
    """Names: ``res{j}``."""

    def __init__(self, count: int, channels: int, descriptor_dim: int, hidden: int):
        super().__init__()
        self.count = count
        for j in range(count):
            self.add_module(f"res{j}", _AdaINResBlock(channels, descriptor_dim, hidden))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        for j in range(self.count):
            x = getattr(self, f"res{j}")(x, z)
        return x


class _EditingEncoder(nn.Module):
    """Names: ``first.model`` (k7), ``down{i}.model`` (k3 + 2x2 average pool)."""

    def __init__(self, image_nc: int, base: int, max_nc: int, layers: int):
        super().__init__()
        self.layers = layers
        self.first = _Block(_conv_norm_act(image_nc, base, 7))
        for i in range(layers):
            n_in, n_out = min(base * 2**i, max_nc), min(base * 2 ** (i + 1), max_nc)
            self.add_module(f"down{i}", _Block(_conv_norm_act(n_in, n_out, 3, nn.AvgPool2d(2))))

    def forward(self, x: torch.Tensor) -> list:
        out = [self.first(x)]
        for i in range(self.layers):
            out.append(getattr(self, f"down{i}")(out[-1]))
        return out


class _EditingDecoder(nn.Module):
    """Names: ``res{i}``, ``up{i}.model``, ``jump{i}.model`` per scale, ``final.model.0``."""

    def __init__(self, image_nc: int, descriptor_dim: int, base: int, max_nc: int, layers: int, res_blocks: int, hidden: int):
        super().__init__()
        self.layers = layers
        for i in reversed(range(layers)):
            n_in, n_out = min(base * 2 ** (i + 1), max_nc), min(base * 2**i, max_nc)
            self.add_module(f"up{i}", _UpBlock(_conv_norm_act(n_in, n_out, 3)))
            self.add_module(f"res{i}", _AdaINResBlocks(res_blocks, n_in, descriptor_dim, hidden))
            self.add_module(f"jump{i}", _Block(_conv_norm_act(n_out, n_out, 3)))
        self.final = _Block(nn.Sequential(nn.Conv2d(min(base, max_nc), image_nc, kernel_size=7, padding=3), nn.Tanh()))

    def forward(self, features: list, z: torch.Tensor) -> torch.Tensor:
        features = list(features)
        out = features.pop()
        for i in reversed(range(self.layers)):
            out = getattr(self, f"up{i}")(getattr(self, f"res{i}")(out, z))
            out = getattr(self, f"jump{i}")(features.pop()) + out
        return self.final(out)


class EditingNet(nn.Module):
    """Names: ``encoder.*`` (reads portrait and warped image, 6 channels), ``decoder.*``."""

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        c = config
        self.encoder = _EditingEncoder(2 * c.image_channels, c.edit_base_channels, c.max_channels, c.edit_layers)
        self.decoder = _EditingDecoder(
            c.image_channels, c.descriptor_dim, c.edit_base_channels, c.max_channels, c.edit_layers,
            c.edit_res_blocks, c.adain_hidden,
        )

    def forward(self, image: torch.Tensor, warped: torch.Tensor, descriptor: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(torch.cat([image, warped], dim=1)), descriptor)


# ------------------------------------------------------------------------ generator
class FaceRenderer(nn.Module):
    """``renderer.pt``'s ``net_G_ema``: ``mapping_net``, ``warpping_net``, ``editing_net``."""

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        self.mapping_net = MappingNet(config.coeff_dim + config.pose_dim, config.descriptor_dim, config.mapping_layers)
        self.warpping_net = WarpingNet(config)
        self.editing_net = EditingNet(config)

    def forward(self, image: torch.Tensor, motion: torch.Tensor) -> torch.Tensor:
        """
        Args:
            image: ``(B, 3, S, S)`` portraits in ``[-1, 1]``.
            motion: ``(B, coeff_dim + pose_dim, 2r + 1)`` coefficient windows.

        Returns:
            ``(B, 3, S, S)`` frames in ``[-1, 1]``.
        """
        descriptor = self.mapping_net(motion)
        warped = self.warpping_net(image, descriptor)
        return self.editing_net(image, warped, descriptor)


def motion_windows(motion: torch.Tensor, radius: int) -> torch.Tensor:
    """``(F, C)`` per-frame coefficients -> ``(F, C, 2 * radius + 1)`` windows around each
    frame, repeating the first and last frames at the edges."""
    frames = motion.shape[0]
    offsets = torch.arange(-radius, radius + 1, device=motion.device)
    index = (torch.arange(frames, device=motion.device)[:, None] + offsets).clamp(0, frames - 1)
    return motion[index].transpose(1, 2)
