"""The diffusion around the denoiser: the noise schedule, the null style of classifier-free
guidance and DDIM sampling.

The denoiser predicts ``x_0`` directly (not the noise), so a DDIM step recovers the noise
from that prediction and moves deterministically to the previous step.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .config import DreamTalkConfig
from .denoiser import MotionDenoiser


class VarianceSchedule(nn.Module):
    """Linear ``beta`` schedule over ``num_steps`` steps, padded with a step 0 of
    ``beta = 0`` (so ``alpha_bars[0] == 1``: the clean signal).

    Checkpoint buffers (under ``diff_net.var_sched.``), each ``(num_steps + 1,)``:
    ``betas``, ``alphas``, ``alpha_bars``, ``sigmas_flex``, ``sigmas_inflex``.
    """

    def __init__(self, num_steps: int, beta_start: float, beta_end: float):
        super().__init__()
        self.num_steps = num_steps
        betas = torch.cat([torch.zeros(1), torch.linspace(beta_start, beta_end, num_steps)])
        alphas = 1 - betas
        alpha_bars = torch.cumprod(alphas.double(), 0).float()
        # Posterior standard deviation of DDPM (``inflex``) and its upper bound sqrt(beta)
        # (``flex``); DDIM does not use them, the checkpoint holds them.
        previous = torch.cat([torch.ones(1), alpha_bars[:-1]])
        posterior = torch.zeros_like(betas)
        posterior[1:] = (1 - previous[1:]) / (1 - alpha_bars[1:]) * betas[1:]
        self.register_buffer("betas", betas)
        self.register_buffer("alphas", alphas)
        self.register_buffer("alpha_bars", alpha_bars)
        self.register_buffer("sigmas_flex", betas.sqrt())
        self.register_buffer("sigmas_inflex", posterior.sqrt())

    def ddim_timesteps(self, steps: int) -> torch.Tensor:
        """``(steps,)`` ascending steps ``1, 1 + c, 1 + 2c, ...`` with ``c = num_steps // steps``."""
        stride = self.num_steps // steps
        return torch.arange(steps) * stride + 1


class DiffusionNetwork(nn.Module):
    """Everything under the ``diff_net.`` prefix of ``denoising_network.pth``.

    Checkpoint names: ``net.*`` (the :class:`MotionDenoiser`), ``var_sched.*`` and the
    classifier-free-guidance null style, ``null_style_clip`` ``(style_max_len, coeff_dim)``
    zeros and ``null_pad_mask`` ``(style_max_len,)`` all ``False``: the unconditional
    branch is the style code of an all-zero clip of full length, as in training.
    """

    def __init__(self, config: DreamTalkConfig):
        super().__init__()
        self.net = MotionDenoiser(config)
        self.var_sched = VarianceSchedule(config.diffusion_steps, config.beta_start, config.beta_end)
        self.register_buffer("null_style_clip", torch.zeros(config.style_max_len, config.coeff_dim))
        self.register_buffer("null_pad_mask", torch.zeros(config.style_max_len, dtype=torch.bool))
        self.coeff_dim = config.coeff_dim

    def null_style_code(self) -> torch.Tensor:
        """``(1, d_model)`` style code of the unconditional branch."""
        return self.net.style_encoder(self.null_style_clip[None], self.null_pad_mask[None])

    @torch.no_grad()
    def ddim_sample(
        self,
        content: torch.Tensor,
        style_code: torch.Tensor,
        steps: int,
        guidance_scale: float = 1.0,
        generator: Optional[torch.Generator] = None,
    ) -> torch.Tensor:
        """Sample expression coefficients.

        Args:
            content: ``(B, L, W, d_model)`` content-encoder output.
            style_code: ``(B, d_model)`` ready style codes.
            steps: DDIM steps.
            guidance_scale: classifier-free guidance; ``x0 = uncond + s * (cond - uncond)``.
                At 1.0 that is the conditional prediction alone, which is computed directly.
            generator: source of the initial noise.

        Returns:
            ``(B, L, coeff_dim)`` coefficients.
        """
        batch, frames = content.shape[:2]
        device, dtype = content.device, content.dtype
        schedule = self.var_sched
        timesteps = schedule.ddim_timesteps(steps).tolist()
        previous = [0] + timesteps[:-1]

        guided = guidance_scale != 1.0
        if guided:
            # Conditional and unconditional branches run as one batch of 2B.
            null = self.null_style_code().expand(batch, -1)
            style_code = torch.cat([style_code, null])
            content = torch.cat([content, content])

        x = torch.randn(batch, frames, self.coeff_dim, generator=generator, device=device, dtype=dtype)
        for t, t_prev in zip(reversed(timesteps), reversed(previous)):
            alpha_bar, alpha_bar_prev = schedule.alpha_bars[t], schedule.alpha_bars[t_prev]
            t_batch = torch.full((style_code.shape[0],), float(t), device=device)
            x0 = self.net(torch.cat([x, x]) if guided else x, t_batch, content, style_code)
            if guided:
                cond, uncond = x0.chunk(2)
                x0 = uncond + guidance_scale * (cond - uncond)
            noise = (x - alpha_bar.sqrt() * x0) / (1 - alpha_bar).sqrt()
            x = alpha_bar_prev.sqrt() * x0 + (1 - alpha_bar_prev).sqrt() * noise
        return x
