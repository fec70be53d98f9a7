from pathlib import Path

from setuptools import setup

setup(
    name="empatheia",
    version="0.1.0",
    description="Multimodal empathetic response generation: text, speech and talking-head video.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=["empatheia", "empatheia.encoders", "empatheia.heads", "empatheia.data", "empatheia.training", "generators", "generators.dreamtalk", "training"],
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
        "train": ["deepspeed>=0.16", "tensorboard>=2.14"],
        "test": ["pytest>=8", "deepspeed>=0.16", "tensorboard>=2.14"],
    },
    entry_points={"console_scripts": ["empatheia=empatheia.cli:main"]},
)
