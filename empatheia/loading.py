"""What the command lines share: loading the model and the label sets they are given,
and reporting progress on standard error (standard output carries the results)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

from .config_loader import ConfigError, parse_sets

if TYPE_CHECKING:
    from .labels import LabelSets
    from .modeling import Empatheia


def progress(message: str) -> None:
    print(f"[empatheia] {message}", file=sys.stderr, flush=True)


def model_overrides(args: argparse.Namespace) -> Dict[str, Any]:
    """The model config keys given with ``--set``; a malformed item is a clean error."""
    try:
        return parse_sets(args.set)
    except ConfigError as error:
        raise SystemExit(f"error: {error}")


def load_model(args: argparse.Namespace) -> "Empatheia":
    """The model of ``--checkpoint`` or ``--preset`` with ``--set``'s keys, in ``--dtype``
    on ``--device``; a model that cannot be built is a clean error, not a traceback."""
    import torch

    from .modeling import Empatheia

    dtype = getattr(torch, args.dtype) if args.dtype else None
    overrides = model_overrides(args)
    try:
        if args.checkpoint is not None:
            progress(f"loading model from {args.checkpoint}")
            model = Empatheia.from_pretrained(args.checkpoint, overrides, dtype=dtype)
        else:
            progress(f"building the {args.preset} preset")
            model = Empatheia.from_preset(args.preset, overrides, dtype=dtype)
    except (FileNotFoundError, ValueError, KeyError) as error:
        raise SystemExit(f"error: {error}")
    if args.device:
        model.to(args.device)
    return model


def load_labels(path: Optional[Path]) -> Optional["LabelSets"]:
    """Label sets from a YAML file (``emotions``, ``profile``, ``emotion_fold``), or
    ``None`` without one (whoever reads the data then uses its default: AvaMERG's, or the
    model's); a bad file is a clean error."""
    from .labels import LabelSets

    if path is None:
        return None
    try:
        return LabelSets.from_yaml(path)
    except ValueError as error:
        raise SystemExit(f"error: {error}")
