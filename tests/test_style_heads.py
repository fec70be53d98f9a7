"""The Style Disentangler reads the dialogue, not only the signal position (issue: its
output was the same for every dialogue on the shipped small weights)."""

from __future__ import annotations

import torch

from empatheia.config import StyleDisentanglerConfig
from empatheia.heads import SignalStandardizer, StyleDisentangler


def _signal_states(labels: torch.Tensor, fixed: torch.Tensor, directions: torch.Tensor, generator) -> torch.Tensor:
    """``(B, n, D)`` states as a language core gives them at its signal tokens: a large
    vector fixed by the position plus a small part that depends on the dialogue."""
    noise = 0.05 * torch.randn(labels.shape[0], *fixed.shape, generator=generator)
    return fixed + directions[labels][:, None, :] + noise


def _small_head(width: int, signals: int) -> StyleDisentangler:
    config = StyleDisentanglerConfig(d_model=32, num_heads=4, num_layers=1, ffn_dim=64, latent_dim=16,
                                     dropout=0.0, num_queries=2, speech_style_dim=6, video_style_dim=6)
    torch.manual_seed(0)
    return StyleDisentangler(config, width, signals)


def _train_emotions(head: StyleDisentangler, inputs, classes: int, generator, steps: int = 150) -> None:
    """``steps`` AdamW steps of emotion cross-entropy on batches of 16 random labels;
    ``inputs(labels)`` gives the head's arguments. Leaves the head in evaluation mode."""
    optimiser = torch.optim.AdamW(head.parameters(), lr=2e-3)
    for _ in range(steps):
        labels = torch.randint(0, classes, (16,), generator=generator)
        out = head(*inputs(labels))
        loss = torch.nn.functional.cross_entropy(out.emotion_logits, labels) + 1e-3 * out.kl.mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    head.eval()


def test_standardizer_tracks_each_positions_statistics_and_is_fixed_in_eval():
    gen = torch.Generator().manual_seed(0)
    norm = SignalStandardizer(3, 5)
    centre = torch.randn(3, 5, generator=gen) * 40.0
    for _ in range(60):
        norm(centre + 2.0 * torch.randn(8, 3, 5, generator=gen))
    torch.testing.assert_close(norm.running_mean, centre, atol=0.5, rtol=0.0)
    torch.testing.assert_close(norm.running_var, torch.full((3, 5), 4.0), atol=1.2, rtol=0.0)
    norm.eval()
    x = centre + 2.0 * torch.randn(4, 3, 5, generator=gen)
    before = norm.running_mean.clone()
    out = norm(x)
    assert torch.equal(norm.running_mean, before)  # evaluation never moves the statistics
    assert out.abs().mean() < 2.0  # about unit scale, where the raw states are about 40
    torch.testing.assert_close(norm(x[:1]), out[:1])  # one item reads as it does in a batch


def test_head_learns_emotions_that_move_the_states_by_a_few_percent():
    gen = torch.Generator().manual_seed(0)
    width, signals, classes = 48, 4, 7
    head = _small_head(width, signals)
    fixed = torch.randn(signals, width, generator=gen) * 8.0  # norm about 55 per position
    directions = torch.randn(classes, width, generator=gen) * 0.3  # about 4 % of it
    _train_emotions(head, lambda labels: (_signal_states(labels, fixed, directions, gen),) * 2, classes, gen)
    labels = torch.arange(classes).repeat(8)
    states = _signal_states(labels, fixed, directions, gen)
    with torch.no_grad():
        out = head(states, states)
    predicted = out.emotion_logits.argmax(-1)
    assert (predicted == labels).float().mean() > 0.8
    assert predicted.unique().numel() == classes
    # The style features differ between dialogues of different emotions.
    assert (out.video_style[labels == 0].mean(0) - out.video_style[labels == 1].mean(0)).abs().max() > 0.05


def test_head_reads_an_emotion_that_only_the_chain_slot_carries():
    """The signal states say nothing of the emotion here (position and noise only); the
    emotion-slot state does, and the head learns it from there. A row without the slot
    falls back to the stand-in token, whatever ``chain_state`` holds."""
    gen = torch.Generator().manual_seed(0)
    width, signals, classes = 48, 4, 7
    head = _small_head(width, signals)
    fixed = torch.randn(signals, width, generator=gen) * 8.0
    directions = torch.randn(classes, width, generator=gen)

    def inputs(labels):
        """Speech and video signal states ``(B, n, D)`` and the slot's state ``(B, D)``."""
        states = fixed + 0.05 * torch.randn(labels.shape[0], signals, width, generator=gen)
        return states, states, directions[labels] + 0.1 * torch.randn(labels.shape[0], width, generator=gen)

    _train_emotions(head, inputs, classes, gen, steps=300)
    labels = torch.arange(classes).repeat(8)
    states, _, chain = inputs(labels)
    with torch.no_grad():
        predicted = head(states, states, chain).emotion_logits.argmax(-1)
        without = head(states, states, chain, torch.zeros(len(labels), dtype=torch.bool)).emotion_logits
    assert (predicted == labels).float().mean() > 0.8
    assert without.argmax(-1).unique().numel() == 1  # no slot: one answer for every row
