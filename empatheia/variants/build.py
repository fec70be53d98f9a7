"""Building each system of the field from a preset or a checkpoint, with what it ships.

=============  ===================================================  ==========================================
system         language core                                        voice and face styles
=============  ===================================================  ==========================================
``empatheia``  the trained model (signal tokens, both heads)         the Style Disentangler
``pipeline``   the base language model tuned with ``pipeline_text``  the written emotion's row of a table
                                                                    measured on the generators
``e3rg``       the trained model's language core (its chain)        the voted emotion's row of a bank
                                                                    measured on real clips
``meria``      soft prompts of the PDR's disentangled features,     the written emotion's row of the
               the M-CoE LLM's chain, the Response LLM's reply      pipeline's table
``early_       the joint embedding of the user's utterance          the written emotion's row of the
fusion``       prepended to a LoRA-tuned core                       pipeline's table
=============  ===================================================  ==========================================

A preset's shipped files sit beside its weights (``empatheia/weights/<preset>/``): the
pipeline's adapter (``pipeline_core.safetensors``) and table (``pipeline_styles.json``),
E3RG's bank (``e3rg_styles.json``), and MERIA's and early fusion's trained parts, where they
ship, in a folder of the system's name (what ``save_pretrained`` writes). A table that is not shipped for the generators in use
is measured on them at load (:func:`~empatheia.variants.styles.measure_generator_styles`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional, Union

from .pipeline import PIPELINE_STYLES, PIPELINE_WEIGHTS, PipelineSystem, load_pipeline_core
from .styles import StyleTable, generators_fingerprint, measure_generator_styles

PathLike = Union[str, Path]
Progress = Optional[Callable[[str], None]]


def shipped_file(preset: Optional[str], name: str) -> Optional[Path]:
    from ..pretrained import SHIPPED_WEIGHTS

    if not preset:
        return None
    path = SHIPPED_WEIGHTS / preset / name
    return path if path.is_file() else None


def _table(model, path: Optional[PathLike], shipped: Optional[str], what: str, progress: Progress) -> StyleTable:
    """The table at ``path``; else the one shipped for the model's preset if it belongs to
    the generators in use; else one measured on them now."""
    speech, head = model.generators()
    if path is not None:
        return StyleTable.load(path)
    candidate = shipped_file(model.config.preset, shipped) if shipped else None
    if candidate is not None:
        table = StyleTable.load(candidate)
        if table.generators == generators_fingerprint(speech, head):
            return table
    if progress:
        progress(f"measuring the {what} on the generators (seven emotions; once per load)")
    try:
        return measure_generator_styles(speech, head, model.avatars())
    except KeyError as error:
        raise ValueError(
            f"no {what} for these generators and none can be measured on them ({error}); "
            "give one with --styles FILE (empatheia variants styles --help)"
        ) from None


def pipeline_styles(model, path: Optional[PathLike] = None, progress: Progress = None) -> StyleTable:
    return _table(model, path, PIPELINE_STYLES, "pipeline's style table", progress)


def e3rg_bank(model, path: Optional[PathLike] = None, progress: Progress = None) -> StyleTable:
    """E3RG's bank: ``path``, the preset's shipped ``e3rg_styles.json`` (real clips), or,
    where neither is, the generators' own table (its rows' sources say so)."""
    if path is None:
        from .e3rg import E3RG_STYLES

        speech, head = model.generators()
        candidate = shipped_file(model.config.preset, E3RG_STYLES)
        if candidate is not None:
            bank = StyleTable.load(candidate)
            if bank.generators == generators_fingerprint(speech, head):
                return bank
    return _table(model, path, PIPELINE_STYLES, "emotion bank (no real clips for these generators)", progress)


def build_pipeline(
    preset: Optional[str] = None,
    checkpoint: Optional[PathLike] = None,
    overrides: Optional[Dict[str, object]] = None,
    dtype=None,
    styles: Optional[PathLike] = None,
    device=None,
    progress: Progress = None,
) -> PipelineSystem:
    """The pipeline of ``checkpoint`` (a model trained with stage ``pipeline_text``) or of
    ``preset`` (its shipped pipeline adapter; a preset without one, such as ``tiny``,
    keeps the adapter's initial weights)."""
    from ..modeling import Empatheia

    if checkpoint is not None:
        model = Empatheia.from_pretrained(checkpoint, overrides, dtype=dtype)
    else:
        model = Empatheia.from_preset(preset or "small", overrides, dtype=dtype, trained=False)
        core = shipped_file(preset or "small", PIPELINE_WEIGHTS)
        if core is not None:
            load_pipeline_core(model, core)
        elif progress:
            progress(f"no pipeline weights ship for preset {preset!r}: its language core is untrained "
                     "(train one: empatheia train --system pipeline)")
    if device:
        model.to(device)
    return PipelineSystem(model, pipeline_styles(model, styles, progress))


def build_e3rg(
    model,
    styles: Optional[PathLike] = None,
    memory: Optional[PathLike] = None,
    readers=None,
    progress: Progress = None,
):
    """E3RG over a trained ``model``, its bank (:func:`e3rg_bank`), the shipped emotion
    readers (unless ``readers`` are given) and a memory under ``memory`` (``None``: this
    process only)."""
    from .e3rg import E3RGSystem
    from .memory import EmpathyMemory

    if readers is None:
        from .readers import load_small_readers

        readers = load_small_readers()
    return E3RGSystem(model, e3rg_bank(model, styles, progress), readers, EmpathyMemory(memory))


def build_trained_variant(
    system: str,
    preset: Optional[str] = None,
    checkpoint: Optional[PathLike] = None,
    overrides: Optional[Dict[str, object]] = None,
    dtype=None,
    styles: Optional[PathLike] = None,
    device=None,
    progress: Progress = None,
):
    """MERIA or early fusion (``system``) answering: the model of ``checkpoint`` (its last
    stage's output), or the one ``preset`` ships (``empatheia/weights/<preset>/<system>/``),
    or, where none ships, a fresh one (random soft prompts and adapters: it answers like
    its base model until trained); its generators are driven by the pipeline's table."""
    from ..pretrained import SHIPPED_WEIGHTS
    from .models import build_variant_model, load_variant_model

    if checkpoint is not None:
        model = load_variant_model(checkpoint, overrides, dtype)
    else:
        shipped = SHIPPED_WEIGHTS / (preset or "small") / system
        if shipped.is_dir():
            model = load_variant_model(shipped, overrides, dtype)
        else:
            if progress:
                progress(f"no {system} weights ship for preset {preset!r}: its parts are untrained "
                         f"(train them: docs/variants.md)")
            model = build_variant_model(system, preset or "small", overrides=overrides, dtype=dtype)
    if device:
        model.to(device)
    table = pipeline_styles(model.core, styles, progress)
    if system == "meria":
        from .meria import MeriaSystem

        return MeriaSystem(model, table)
    from .early_fusion import EarlyFusionSystem

    return EarlyFusionSystem(model, table)
