"""Train the ``small`` preset end to end: the four stages on EmpatheticDialogues, offline.

    python -m empatheia.recipes.small_preset --ed ../shared/data/ed/ed_valid_conversations.jsonl --out runs/small

1. ``empatheia data split``: a fixed 10 % of the conversations (smallest SHA-256 of the
   conversation id) is held out for evaluation; the rest is the training split.
2. Stage 1 (Chain of Empathy) on the training split's text.
3. ``empatheia data render``: the first ``--render`` training conversations are spoken and
   animated by the offline generators, each utterance in its emotion's style.
4. Gold features of those renderings from the same generators.
5. Stages 2, 3 and 4 on the rendered set, each starting from the previous stage.
6. The Style Disentangler alone, ``--style-refit-steps`` steps on stage 4's frozen signal
   states (:mod:`empatheia.training.style_refit`) of the rendered dialogues, with and
   without their media, and of ``--text-dialogues`` more training-split dialogues as text,
   into ``OUT/style_refit/final``; ``--style-refit-parts style`` trains only the parts
   that make S^s and S^v (the classifiers kept as they are).
7. The Content Synchronizer alone, ``--content-refit-steps`` steps on the frozen response
   states (:mod:`empatheia.training.content_refit`) of the rendered dialogues, with and
   without their media, into ``OUT/content_refit/final``.

``--refit-from WEIGHTS`` (or ``shipped``) skips stages 1-4: steps 6 and 7 start from those
weights, on this run's rendering and gold features (how the shipped weights were last
refit when the generators changed under them).

8. With ``--export-weights DIR``: the trained parts of the last of these (or of stage
   ``--export-stage``'s) in half precision into ``DIR/empatheia.safetensors``
   (``empatheia/weights/small`` is where :meth:`Empatheia.from_preset` finds them); with ``--export-metrics DIR``: each stage's
   ``metrics.jsonl`` and ``train_config.yaml`` into ``DIR/<stage>/`` and a table of them
   in ``DIR/summary.md``.

Every stage runs the repository's recipe (:mod:`empatheia.recipes.recipe`) with its stage config,
the overrides in :data:`SETTINGS` and then any ``--set KEY=VALUE``, each in a process of
its own (``--in-process``: all in this one; started with jemalloc preloaded where it is
installed, ``--allocator``); a stage whose ``final/`` exists is skipped,
and an interrupted one resumes from its newest checkpoint. The result is the last of
``OUT/content_refit/final``, ``OUT/style_refit/final`` and ``OUT/stage4_joint/final`` that ran.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes.util
import hashlib
import json
import multiprocessing
import os
import re
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import Dict, List, Sequence

from empatheia.stages import STAGES

# Overrides of configs/train/stageN_*.yaml for a laptop CPU (or one small GPU).
COMMON = {
    "model.preset": "small",
    "model.dtype": None,
    "deepspeed": None,
    "data.num_workers": 1,
    "optim.scheduler": "cosine",
    "logging_steps": 5,
    "save_steps": 25,
    "save_total_limit": 2,
    "eval_steps": None,
}
SETTINGS: Dict[int, Dict[str, object]] = {
    1: {"optim.batch_size": 8, "optim.gradient_accumulation_steps": 2, "optim.learning_rate": 3e-4,
        "optim.warmup_steps": 20},
    2: {"optim.batch_size": 8, "optim.gradient_accumulation_steps": 1, "optim.learning_rate": 5e-4,
        "optim.warmup_steps": 10},
    3: {"optim.batch_size": 8, "optim.gradient_accumulation_steps": 1, "optim.learning_rate": 5e-4,
        "optim.warmup_steps": 10},
    # Half of stage 4's examples as text alone: ED's held-out dialogues and the demo are
    # typed, and the Style Disentangler's running statistics must cover those prompts too.
    # The heads and projectors keep stage 2-3's rate while LoRA adapts at a fifth of it.
    4: {"optim.batch_size": 4, "optim.gradient_accumulation_steps": 2, "optim.learning_rate": 1e-4,
        "optim.head_learning_rate": 5e-4, "optim.warmup_steps": 10, "data.text_only_share": 0.5},
}


def _sets(values: Dict[str, object]) -> List[str]:
    return [f"{k}={json.dumps(v)}" for k, v in values.items()]


def run_stage(stage: int, out: Path, data: Path, steps: int, gold: Path = None, previous: Path = None, preset: str = "small",
              extra: Sequence[str] = (), isolated: bool = True, environment: Dict[str, str] = None):
    """Run stage ``stage`` into ``out/<its name>`` (skipped when its ``final/`` exists,
    resumed when the folder does), in a process of its own unless ``isolated`` is false,
    started with ``environment`` added to this one's (:func:`allocator_environment`);
    returns that folder."""
    from empatheia.training import load_train_config

    name = STAGES[stage].name
    output_dir = out / name
    if (output_dir / "final" / "empatheia.safetensors").is_file():
        print(f"[small] stage {stage}: {output_dir / 'final'} exists, skipped")
        return output_dir
    values = {**COMMON, **SETTINGS[stage], "model.preset": preset, "data.train": str(data), "output_dir": str(output_dir),
              "max_steps": steps, "model.init": str(previous) if previous else None,
              "data.gold_features": str(gold) if gold else None, "data.media_root": None,
              # Stages 3 and 4 read every turn's speech and video: encode each file once.
              "data.media_cache": str(out / "encoder_cache") if STAGES[stage].reads_media else None}
    overrides = _sets(values) + list(extra)
    # Load the config here too: a bad --set fails before a process is started.
    load_train_config(_stage_config(stage), overrides)
    resume = output_dir.exists()
    if not isolated:
        _run_stage(stage, overrides, resume)
        return output_dir
    # A fresh process per stage: after stage 1 the process still held about 16 GB of the
    # 23 here, and stage 2's forked DataLoader worker was OOM-killed beside it.
    process = multiprocessing.get_context("spawn").Process(
        target=_run_stage, args=(stage, overrides, resume), name=f"small-{name}"
    )
    with _environment(environment or {}):
        process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(
            f"stage {stage} ({name}) failed: its process exited with {process.exitcode} "
            f"(its error is printed above; a negative code is the signal that killed it, -9 often "
            f"the kernel's out-of-memory killer). The same command resumes from the newest "
            f"checkpoint in {output_dir}."
        )
    return output_dir


ALLOCATORS = ("auto", "jemalloc", "system")


def allocator_environment(allocator: str = "auto") -> Dict[str, str]:
    """What a stage process's environment needs for ``allocator``, over this process's:
    ``LD_PRELOAD`` with jemalloc added for ``"jemalloc"``, and for ``"auto"`` where the
    library is installed (Debian: ``apt-get install libjemalloc2``), with jemalloc taken out
    for ``"system"``; nothing where the preload is already so, or off Linux.

    Why: a CPU training step allocates and frees tensors of ever new sizes, which glibc's
    allocator leaves as a fragmented heap that grows all run and slows the steps; jemalloc's
    stays compact, with the same losses (measured in docs/small_preset.md, Speed)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator {allocator!r}: expected one of {', '.join(ALLOCATORS)}")
    preloaded = os.environ.get("LD_PRELOAD", "")
    if allocator == "system":
        # The dynamic loader splits LD_PRELOAD at colons and spaces.
        kept = ":".join(name for name in re.split(r"[: ]", preloaded) if name and "jemalloc" not in name)
        return {"LD_PRELOAD": kept} if "jemalloc" in preloaded else {}
    if "jemalloc" in preloaded:
        return {}
    library = ctypes.util.find_library("jemalloc") if sys.platform.startswith("linux") else None
    if library is None:
        if allocator == "jemalloc":
            raise FileNotFoundError("--allocator jemalloc: no jemalloc library found (Debian and Ubuntu: "
                                    "apt-get install libjemalloc2; or give --allocator system)")
        return {}
    return {"LD_PRELOAD": f"{preloaded}:{library}" if preloaded else library}


@contextlib.contextmanager
def _environment(values: Dict[str, str]):
    """``os.environ`` with ``values`` set while the block runs (a spawned process copies it
    when it starts), as it was afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def language_core_from(weights: Path, output_dir: Path, preset: str = "small") -> Path:
    """Stand in for stage 1 with a language core trained before: write
    ``output_dir/final`` as the ``preset`` model before training whose LoRA adapter and
    signal-token rows (the parts stage 1 trains) come from ``weights`` (a trained
    model's folder or its ``empatheia.safetensors``, e.g. the shipped one). Projectors and
    heads keep their fresh initialisation, so stages 2-4 train them from scratch as after
    stage 1. Returns ``output_dir``."""
    from empatheia import Empatheia
    from empatheia.modeling import load_trained_state

    final = output_dir / "final"
    if (final / "empatheia.safetensors").is_file():
        print(f"[small] stage 1: {final} exists, skipped")
        return output_dir
    model = Empatheia.from_preset(preset, trained=False)
    state = model.trained_state_dict()
    source = load_trained_state(weights)
    core = {k: v for k, v in source.items() if k.startswith("language_model.")}
    if set(core) != {k for k in state if k.startswith("language_model.")}:
        raise ValueError(f"{weights}: its language-core keys do not match the {preset} preset's LoRA adapter and signal rows")
    state.update(core)
    model.load_trained_state_dict(state, source=str(weights))
    model.save_pretrained(final)
    digest = hashlib.sha256(Path(weights).read_bytes()).hexdigest()
    (output_dir / SOURCE_NAME).write_text(json.dumps({"language_core_from": str(weights), "sha256": digest}, indent=1) + "\n")
    print(f"[small] stage 1: the language core of {weights} in {final}")
    return output_dir


REFIT = "style_refit"
CONTENT_REFIT = "content_refit"
STATES_NAME = "signal_states.safetensors"
"""The style refit's collected signal states, in ``out/style_refit/``."""
RESPONSE_STATES_NAME = "response_states.safetensors"
"""The content refit's collected response states, in ``out/content_refit/``."""


def load_start(start, preset: str = "small"):
    """The model a refit starts from: a trained model's folder (its ``final/``), or the
    package's shipped weights with ``"shipped"``; and the weights file that names it."""
    from empatheia import Empatheia
    from empatheia.pretrained import shipped_weights

    if str(start) == "shipped":
        weights = shipped_weights(preset)
        if weights is None:
            raise FileNotFoundError(f"the {preset} preset ships no weights to refit")
        return Empatheia.from_preset(preset), Path(weights)
    return Empatheia.from_pretrained(Path(start) / "final"), Path(start) / "final" / "empatheia.safetensors"


def states_key(weights: Path, examples: Sequence[str], layout: str) -> str:
    """What a file of collected states was collected from: the weights (path and
    modification time), the examples and the kind of states."""
    return hashlib.sha256(json.dumps({
        "weights": [str(weights.resolve()), weights.stat().st_mtime_ns],
        "examples": list(examples),
        "layout": layout,
    }).encode()).hexdigest()


def kept_states(kind, path: Path, key: str, collect, step: str):
    """The states of ``kind`` (:class:`~empatheia.training.style_refit.SignalStates` or
    :class:`~empatheia.training.content_refit.ResponseStates`) kept at ``path`` when its key
    is ``key``; otherwise ``collect()``'s, kept there. Collecting them is most of a refit's
    time, so a refit with other settings (delete ``final/``) starts from them; the key
    tells whether a kept file holds these examples of these weights."""
    if path.is_file() and kind.key_of(path) == key:
        return kind.load(path)
    if path.is_file():
        print(f"[small] {step}: {path} holds other examples or weights; collecting again")
    states = collect()
    path.parent.mkdir(parents=True, exist_ok=True)
    states.save(path, key)
    return states


def style_refit(out: Path, start, rendered: Path, gold: Path, text_file: Path, text_dialogues: int, steps: int,
                seed: int = 0, parts: str = "all", preset: str = "small") -> Path:
    """Step 6: refit the Style Disentangler of ``start`` (stage 4's folder, or
    ``"shipped"``) on its frozen signal states; writes
    ``out/style_refit/{final,metrics.jsonl,train_config.yaml}`` (skipped when ``final/``
    exists) and returns that folder. ``parts="style"`` trains only the parts that make
    S^s and S^v."""
    import yaml

    from empatheia.data import GoldFeatureStore, MediaFeatureCache, StageDataset, read_dataset
    from empatheia.data.dataset import stable_fraction
    from empatheia.training.style_refit import (
        STYLE_PARTS,
        SignalStates,
        add_chain_reading,
        add_class_styles,
        collect_signal_states,
        refit_style_disentangler,
    )

    # The style parts alone are linear maps (the trained style layers and zero-initialised
    # offset tables) on fixed features: they take a tenfold rate.
    learning_rate, batch_size = (3e-4, 64) if parts == "all" else (3e-3, 64)

    output_dir = out / REFIT
    if (output_dir / "final" / "empatheia.safetensors").is_file():
        print(f"[small] style refit: {output_dir / 'final'} exists, skipped")
        return output_dir
    model, weights = load_start(start, preset)
    if add_chain_reading(model):
        print(f"[small] style refit: {weights} was trained without the emotion-slot input; the refit adds it")
    if add_class_styles(model):
        print(f"[small] style refit: {weights} has no per-class style offsets; the refit adds them")
    labels = model.label_sets()
    corpus = read_dataset(rendered, labels=labels, require_media=True).dialogues
    known = {d.id for d in corpus}
    # A fixed draw of the training split's other dialogues (by a hash of their id).
    text = [d for d in read_dataset(text_file, labels=labels).dialogues if d.id not in known and d.response and d.emotion]
    text = sorted(text, key=lambda d: stable_fraction(f"style-refit:{d.id}"))[:text_dialogues]
    def collect() -> SignalStates:
        store, cache = GoldFeatureStore(gold), MediaFeatureCache(out / "encoder_cache", model.processor.config)
        datasets = [
            StageDataset(corpus, model.processor, 4, store, labels, cache),
            StageDataset(corpus, model.processor, 4, store, labels, cache, text_only_share=1.0),
            StageDataset([], model.processor, 4, store, labels, cache, text_dialogues=text),
        ]
        return SignalStates.concatenate([collect_signal_states(model, d) for d in datasets if len(d)])

    key = states_key(weights, [d.id for d in corpus] + [d.id for d in text], "signals+chain")
    states = kept_states(SignalStates, output_dir / STATES_NAME, key, collect, "style refit")
    settings = {"init": str(weights), "rendered": str(rendered), "text": str(text_file),
                "text_dialogues": len(text), "examples": len(states), "steps": steps, "parts": parts,
                "learning_rate": learning_rate, "batch_size": batch_size, "seed": seed}
    log = refit_style_disentangler(model, states, steps, learning_rate=learning_rate, batch_size=batch_size, seed=seed,
                                   only=STYLE_PARTS if parts == "style" else None)
    model.save_pretrained(output_dir / "final")
    (output_dir / "train_config.yaml").write_text(yaml.safe_dump({"recipe": REFIT, **settings}, sort_keys=False))
    with open(output_dir / "metrics.jsonl", "w") as file:
        for row in log:
            file.write(json.dumps({**row, "split": "train", "examples": row["step"] * batch_size}) + "\n")
    print(f"[small] style refit: {len(states)} examples, {steps} steps -> {output_dir / 'final'}")
    return output_dir


def content_refit(out: Path, start, rendered: Path, gold: Path, steps: int, seed: int = 0, preset: str = "small") -> Path:
    """Step 7: refit the Content Synchronizer of ``start`` (a trained model's folder, or
    ``"shipped"``) on its frozen response states of the rendered dialogues, with and
    without their media; writes ``out/content_refit/{final,metrics.jsonl,train_config.yaml}``
    (skipped when ``final/`` exists) and returns that folder."""
    import yaml

    from empatheia.data import GoldFeatureStore, MediaFeatureCache, StageDataset, read_dataset
    from empatheia.training.content_refit import (
        ResponseStates,
        add_unit_context,
        collect_response_states,
        refit_content_synchronizer,
    )

    learning_rate, batch_size = 3e-4, 32
    output_dir = out / CONTENT_REFIT
    if (output_dir / "final" / "empatheia.safetensors").is_file():
        print(f"[small] content refit: {output_dir / 'final'} exists, skipped")
        return output_dir
    model, weights = load_start(start, preset)
    if add_unit_context(model):
        print(f"[small] content refit: {weights} has no unit context; the refit adds it")
    labels = model.label_sets()
    corpus = read_dataset(rendered, labels=labels, require_media=True).dialogues
    def collect() -> ResponseStates:
        store, cache = GoldFeatureStore(gold), MediaFeatureCache(out / "encoder_cache", model.processor.config)
        return ResponseStates.concatenate([
            collect_response_states(model, StageDataset(corpus, model.processor, 4, store, labels, cache, text_only_share=share))
            for share in (0.0, 1.0)
        ])

    key = states_key(weights, [d.id for d in corpus], "response")
    states = kept_states(ResponseStates, output_dir / RESPONSE_STATES_NAME, key, collect, "content refit")
    log = refit_content_synchronizer(model, states, steps, learning_rate=learning_rate, batch_size=batch_size, seed=seed)
    model.save_pretrained(output_dir / "final")
    settings = {"init": str(weights), "rendered": str(rendered), "examples": len(states), "steps": steps,
                "learning_rate": learning_rate, "batch_size": batch_size, "seed": seed}
    (output_dir / "train_config.yaml").write_text(yaml.safe_dump({"recipe": CONTENT_REFIT, **settings}, sort_keys=False))
    with open(output_dir / "metrics.jsonl", "w") as file:
        for row in log:
            file.write(json.dumps({**row, "split": "train", "examples": row["step"] * batch_size}) + "\n")
    print(f"[small] content refit: {len(states)} examples, {steps} steps -> {output_dir / 'final'}")
    return output_dir


def _stage_config(stage: int) -> Path:
    # configs/train/ ships inside the package (empatheia.configs), so an installed copy
    # finds the stage configs as a checkout does.
    return Path(str(resources.files("empatheia.configs") / "train" / f"{STAGES[stage].name}.yaml"))


def _exit_with_parent() -> None:
    """End this process when the recipe process that started it ends. A stage whose recipe
    was killed (``kill``, a closed terminal, a scheduler's time limit) would otherwise train
    on unseen, holding the memory and cores the next run needs; it resumes from its newest
    checkpoint instead."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the parent's end of the pipe closes, i.e. when it exits
        print(f"[small] the recipe (pid {parent.pid}) ended: stopping this stage; the same command "
              f"resumes it from its newest checkpoint", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_stage(stage: int, overrides: Sequence[str], resume: bool) -> None:
    from empatheia.training import load_train_config
    from empatheia.recipes.recipe import run

    _exit_with_parent()
    run(load_train_config(_stage_config(stage), list(overrides)), resume=resume)


_STATISTICS = (".running_mean", ".running_var")
SOURCE_NAME = "source.json"
"""Written in place of a stage's metrics when ``--stage1-from`` stood in for its training."""


def export_weights(final: Path, folder: Path, dtype=None) -> Path:
    """The trained parts of the model in ``final`` with floating weights cast to ``dtype``
    (default ``torch.float16``: half the size; loading casts back to the model's dtype;
    running statistics stay float32) as one file, ``folder/empatheia.safetensors``, written
    whole then renamed. One file holds them all, adapter included (the layout of version 1,
    which :meth:`Empatheia.from_preset` reads): the package ships each preset's weights as
    a single ``.safetensors`` file of its data."""
    import torch
    from safetensors.torch import save_file

    from empatheia.io import atomic_path
    from empatheia.modeling import load_trained_state

    dtype = dtype or torch.float16
    state = load_trained_state(final)
    # Running statistics stay in float32: a half-precision mean of about 50 would round
    # by more than the spread it standardises.
    state = {k: v.to(dtype) if v.is_floating_point() and not k.endswith(_STATISTICS) else v for k, v in state.items()}
    target = Path(folder) / "empatheia.safetensors"
    with atomic_path(target) as partial:
        # The run folder's own name and below: the file ships, the machine it came from does not.
        source = "/".join(Path(final).parts[-3:])
        save_file(state, str(partial), metadata={"source": source, "dtype": str(dtype).replace("torch.", ""), "version": "1"})
    return target


def export_metrics(stage_dirs: Dict[str, Path], folder: Path) -> Path:
    """Each stage's ``metrics.jsonl`` and ``train_config.yaml`` (what reproduces and shows
    its training) into ``folder/<stage>/``, and ``folder/summary.md``: a table of steps,
    examples seen and the training loss (first logged value, mean of the last five) with
    the loss terms at the end."""
    import shutil

    lines = [
        "| stage | steps | examples | loss, first log | loss, mean of last 5 logs | terms at the end |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, stage_dir in stage_dirs.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        if (stage_dir / SOURCE_NAME).is_file() and not (stage_dir / "metrics.jsonl").is_file():
            source = json.loads((stage_dir / SOURCE_NAME).read_text())
            shutil.copyfile(stage_dir / SOURCE_NAME, folder / name / SOURCE_NAME)
            lines.append(f"| {name} | – | – | – | – | not trained in this run: the language core of "
                         f"{Path(source['language_core_from']).name} (sha256 {source['sha256'][:12]}) |")
            continue
        for file in ("metrics.jsonl", "train_config.yaml"):
            shutil.copyfile(stage_dir / file, folder / name / file)
        rows = [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        train = [r for r in rows if r.get("split") == "train"]
        if not train:
            raise ValueError(f"{stage_dir / 'metrics.jsonl'}: no training rows")
        last = train[-1]
        tail = [r["loss"] for r in train[-5:]]
        terms = ", ".join(f"{k} {v:.4g}" for k, v in last.items() if k.startswith(("loss_", "kl_", "weighted_")))
        lines.append(
            f"| {name} | {last['step']} | {last['examples']} | {train[0]['loss']:.4f} | {sum(tail) / len(tail):.4f} | {terms} |"
        )
    summary = folder / "summary.md"
    summary.write_text("\n".join(lines) + "\n")
    return summary


def main(argv=None) -> None:
    from empatheia.config_loader import add_set_argument

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ed", type=Path, required=True, help="EmpatheticDialogues conversations JSONL")
    parser.add_argument("--out", type=Path, default=Path("runs/small"))
    parser.add_argument("--stage1-steps", type=int, default=640, help="about two epochs of the split at 16 a step")
    parser.add_argument("--render", type=int, default=200, help="training conversations to speak and animate")
    parser.add_argument("--media-steps", type=int, default=150, help="optimizer steps of stages 2, 3 and 4 each")
    parser.add_argument("--stage4-steps", type=int, help="optimizer steps of stage 4 (default: --media-steps)")
    parser.add_argument("--style-refit-steps", type=int, default=1000,
                        help="steps of the Style Disentangler alone on stage 4's frozen signal states (0: none)")
    parser.add_argument("--text-dialogues", type=int, default=1200,
                        help="training-split dialogues, as text, beside the rendered ones in the style refit")
    parser.add_argument("--style-refit-parts", choices=("all", "style"), default="all",
                        help="what the style refit trains: the whole Style Disentangler, or only the parts that "
                             "make S^s and S^v (the classifiers kept)")
    parser.add_argument("--content-refit-steps", type=int, default=2000,
                        help="steps of the Content Synchronizer alone on the frozen response states (0: none)")
    parser.add_argument("--refit-from", metavar="WEIGHTS",
                        help="skip stages 1-4 and run the refits from this trained model's folder, or from the "
                             "package's shipped weights with 'shipped'")
    parser.add_argument("--workers", type=int, default=2, help="rendering processes")
    parser.add_argument("--faces", type=Path, help="recorded face clips (MEAD names) that half the rendered "
                                                   "conversations' speakers show instead of the drawn avatar")
    parser.add_argument("--hold-out-actor", help="leave this actor's face clips out of training (default: the "
                                                 "last actor by name), for bench/face_reading.py")
    parser.add_argument("--stages", default="1,2,3,4")
    parser.add_argument("--stage1-init", metavar="MODEL",
                        help="start stage 1 from this trained model (a save_pretrained folder, or the package's "
                             "shipped weights with 'shipped') rather than the bare preset: its language core "
                             "trains further and every other part is kept (with --stages 1, how the shipped core "
                             "learnt the four-step chain)")
    parser.add_argument("--stage1-data", type=Path, metavar="FILE",
                        help="train stage 1 on this file instead of the split's training conversations, e.g. "
                             "their replies by a trained model (empatheia data distill; docs/small_preset.md)")
    parser.add_argument("--stage1-from", type=Path, metavar="WEIGHTS",
                        help="skip training stage 1: take the language core (LoRA and signal rows) of this "
                             "empatheia.safetensors, or of the package's shipped weights with 'shipped'; "
                             "stages 2-4 then train the projectors and heads from scratch")
    add_set_argument(parser, "override a stage-config key for every stage, after this script's own "
                     "(e.g. mixed_precision=no, or model.overrides={loss.chain_emotion_weight: 0})")
    parser.add_argument("--in-process", action="store_true",
                        help="run the stages in this process (by default each runs in its own, so memory "
                             "one stage still holds is returned before the next)")
    parser.add_argument("--allocator", choices=ALLOCATORS, default="auto",
                        help="the memory allocator of the stage processes: jemalloc (auto: where installed) "
                             "keeps a CPU run's memory at half and its steps from slowing; system: the C library's")
    parser.add_argument("--preset", default="small", help="tiny runs the same pipeline in seconds (for tests)")
    parser.add_argument("--export-weights", type=Path, help="write the result in half precision here (e.g. empatheia/weights/small)")
    parser.add_argument("--export-stage", type=int, choices=sorted(STAGES), default=4,
                        help="whose final/ --export-weights writes (default 4, the end of the curriculum: "
                             "stage 4 after the style refit, when that ran)")
    parser.add_argument("--export-metrics", type=Path, help="copy each stage's metrics.jsonl and train_config.yaml here")
    args = parser.parse_args(argv)
    stages = {int(s) for s in args.stages.split(",")}

    from empatheia.config import EmpatheiaConfig
    from empatheia.pretrained import shipped_weights
    from empatheia.data import extract_gold_features, gold_feature_sources, read_dataset
    from empatheia.data.render import RenderSettings, render_ed_conversations, split_ed_file, read_face_clips, training_face_clips
    from empatheia.generators import build_generators, gold_feature_extractors

    try:
        environment = {} if args.in_process else allocator_environment(args.allocator)
    except FileNotFoundError as error:
        parser.error(str(error))
    if not args.in_process:
        jemalloc = "jemalloc" in {**os.environ, **environment}.get("LD_PRELOAD", "")
        hint = "" if jemalloc or args.allocator == "system" or not sys.platform.startswith("linux") else (
            " (apt-get install libjemalloc2 halves a CPU stage's memory: docs/small_preset.md#speed)")
        print(f"[small] stage processes allocate with {'jemalloc' if jemalloc else 'the system allocator'}{hint}")
    split = split_ed_file(args.ed, args.out / "ed")
    if args.refit_from is not None:
        stages = set()
    if args.refit_from is not None and str(args.refit_from) != "shipped":
        if not (Path(args.refit_from) / "final" / "empatheia.safetensors").is_file():
            parser.error(f"--refit-from {args.refit_from}: no trained model there (no final/empatheia.safetensors)")
    if args.stage1_init is not None and (args.stage1_from is not None or args.refit_from is not None):
        parser.error("--stage1-init trains stage 1; --stage1-from and --refit-from skip it: give one of them")
    if args.stage1_init not in (None, "shipped") and not (Path(args.stage1_init) / "empatheia.safetensors").is_file():
        parser.error(f"--stage1-init {args.stage1_init}: no trained model there (no empatheia.safetensors)")
    if args.stage1_data is not None and not args.stage1_data.is_file():
        parser.error(f"--stage1-data {args.stage1_data}: no such file")
    if args.refit_from is not None:
        previous = args.refit_from
    elif args.stage1_from is not None:
        weights = shipped_weights(args.preset) if str(args.stage1_from) == "shipped" else args.stage1_from
        if weights is None or not Path(weights).is_file():
            parser.error(f"--stage1-from {args.stage1_from}: no such weights file")
        previous = language_core_from(Path(weights), args.out / STAGES[1].name, args.preset)
    elif 1 in stages:
        init = args.preset if str(args.stage1_init) == "shipped" else args.stage1_init
        previous = run_stage(1, args.out, args.stage1_data or split["train"], args.stage1_steps, previous=init,
                             preset=args.preset, extra=args.set, isolated=not args.in_process, environment=environment)
    else:
        previous = args.out / STAGES[1].name
    if not stages & {2, 3, 4} and args.refit_from is None:
        if args.export_weights:
            print(f"[small] weights of stage 1: {export_weights(previous / 'final', args.export_weights)}")
        if args.export_metrics:
            print(f"[small] metrics: {export_metrics({STAGES[1].name: previous}, args.export_metrics)}")
        return
    config = EmpatheiaConfig.from_preset(args.preset)
    cs, sd = config.content_synchronizer, config.style_disentangler
    faces = ()
    if args.faces:
        actors = sorted({clip.actor for clip in read_face_clips(args.faces)})
        faces = training_face_clips(args.faces, args.hold_out_actor or actors[-1])
    settings = RenderSettings(sd.speech_style_dim, sd.video_style_dim, cs.speech_content_dim, cs.video_content_dim,
                              face_clips=faces)
    rendered = render_ed_conversations(
        split["train"], args.out / "rendered", settings, limit=args.render, workers=args.workers
    )
    gold = args.out / "gold"
    sources = gold_feature_sources(read_dataset(rendered))
    extract_gold_features(sources, gold_feature_extractors(*build_generators(config)), gold, batch_size=16)
    for stage in (2, 3, 4) if args.refit_from is None else ():
        if stage in stages:
            steps = args.stage4_steps if stage == 4 and args.stage4_steps else args.media_steps
            previous = run_stage(stage, args.out, rendered, steps, gold=gold, previous=previous,
                                 preset=args.preset, extra=args.set, isolated=not args.in_process,
                                 environment=environment)
        else:
            previous = args.out / STAGES[stage].name
    stage_dirs = {stage.name: args.out / stage.name for stage in STAGES.values()}
    if args.refit_from is not None:
        stage_dirs = {}
    refits = 4 in stages or args.refit_from is not None
    if refits and args.style_refit_steps:
        previous = style_refit(args.out, previous, rendered, gold, split["train"], args.text_dialogues,
                               args.style_refit_steps, parts=args.style_refit_parts, preset=args.preset)
        stage_dirs[REFIT] = previous
    if refits and args.content_refit_steps:
        previous = content_refit(args.out, previous, rendered, gold, args.content_refit_steps, preset=args.preset)
        stage_dirs[CONTENT_REFIT] = previous
    previous = Path(previous)
    print(f"[small] done: {previous / 'final'}")
    if args.export_weights:
        final = previous / "final" if args.export_stage == 4 else args.out / STAGES[args.export_stage].name / "final"
        print(f"[small] weights of stage {args.export_stage}: {export_weights(final, args.export_weights)}")
    if args.export_metrics:
        summary = export_metrics(stage_dirs, args.export_metrics)
        print(f"[small] metrics: {summary}")


if __name__ == "__main__":
    main()
