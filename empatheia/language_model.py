"""The language core (§4.2): a Hugging Face causal LM with LoRA, the ``<Aud>``/``<Vid>``
input placeholders and the ``<AUDi>``/``<VIDi>`` output signal tokens."""

from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from peft.tuners.trainable_tokens.layer import TrainableTokensLayer
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from .config import LanguageModelConfig
from .pretrained import converted_gguf_model, resolve_pretrained
from .prompts import AUDIO_PLACEHOLDER, VIDEO_PLACEHOLDER, audio_signal_tokens, video_signal_tokens


@dataclass(frozen=True)
class SpecialTokenIds:
    audio_placeholder: int
    video_placeholder: int
    audio_signals: tuple
    video_signals: tuple
    pad: int
    eos: int

    @property
    def signals(self) -> tuple:
        return self.audio_signals + self.video_signals


def build_tokenizer(config: LanguageModelConfig, path: Optional[Union[str, Path]] = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer (from ``path`` when given, e.g. a saved checkpoint) and make sure
    every placeholder and signal token is one token."""
    if path is not None:
        source = str(path)
    elif config.tokenizer == "builtin":
        source = None
    elif config.tokenizer:
        source = resolve_pretrained(config.tokenizer)
    elif config.pretrained:
        # A GGUF file carries its own tokenizer, converted and cached with the model.
        source = str(converted_gguf_model(config)) if config.gguf_file else resolve_pretrained(config.pretrained)
    else:
        raise ValueError("language_model.tokenizer or language_model.pretrained must name a tokenizer")
    tokenizer = _builtin_tokenizer() if source is None else AutoTokenizer.from_pretrained(source)
    added = [AUDIO_PLACEHOLDER, VIDEO_PLACEHOLDER]
    added += audio_signal_tokens(config.num_signal_tokens) + video_signal_tokens(config.num_signal_tokens)
    vocab = tokenizer.get_vocab()  # built anew on each call (35 ms for SmolLM2's)
    missing = [t for t in added if t not in vocab]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    for token in added:
        ids = tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"tokenizer splits {token!r} into {len(ids)} tokens {ids}; it must be one token")
    return tokenizer


def special_token_ids(tokenizer: PreTrainedTokenizerBase, config: LanguageModelConfig) -> SpecialTokenIds:
    to_id = tokenizer.convert_tokens_to_ids
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no end-of-sequence token")
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else eos
    return SpecialTokenIds(
        audio_placeholder=to_id(AUDIO_PLACEHOLDER),
        video_placeholder=to_id(VIDEO_PLACEHOLDER),
        audio_signals=tuple(to_id(audio_signal_tokens(config.num_signal_tokens))),
        video_signals=tuple(to_id(video_signal_tokens(config.num_signal_tokens))),
        pad=pad,
        eos=eos,
    )


def build_language_model(
    config: LanguageModelConfig,
    tokenizer: PreTrainedTokenizerBase,
    ids: SpecialTokenIds,
    dtype: Optional[torch.dtype] = None,
) -> PeftModel:
    """The causal LM with room for the new tokens and a LoRA adapter whose trainable parts
    are the LoRA matrices and the signal tokens' embedding and LM-head rows."""
    if config.load_in_4bit:
        model = _load_4bit(config)
    elif config.pretrained:
        source = converted_gguf_model(config) if config.gguf_file else resolve_pretrained(config.pretrained)
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype)
    else:
        architecture = {"vocab_size": len(tokenizer), **config.architecture}
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.model_type, **architecture))
        if dtype is not None:
            model.to(dtype)
    if model.config.hidden_size != config.hidden_size:
        raise ValueError(
            f"language_model.hidden_size is {config.hidden_size} but the model has {model.config.hidden_size}"
        )
    # A GGUF checkpoint leaves a quantizer behind even though the weights are dequantised;
    # peft and save_pretrained refuse such a model.
    if getattr(model, "hf_quantizer", None) is not None and not config.load_in_4bit:
        model.hf_quantizer = None
        model.config.quantization_config = None
        model.is_quantized = False
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer))

    names = {module: name for name, module in model.named_modules()}
    embed_name = names[model.get_input_embeddings()].split(".")[-1]
    signal_rows = list(ids.signals)
    trainable_rows = {embed_name: signal_rows}
    tied = getattr(model.config, "tie_word_embeddings", False)
    if not tied:
        trainable_rows[names[model.get_output_embeddings()].split(".")[-1]] = signal_rows
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=list(config.lora.target_modules),
        trainable_token_indices=trainable_rows,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 reads a property that transformers 5 deprecates; not ours to fix.
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        peft_model = get_peft_model(model, lora)
    # peft's adapter state dict adds the whole (resized) embedding matrix and LM head when
    # the vocabulary differs from the base model's config.json, which it looks up by this
    # name (on the Hub for a Hub name). Here the only trained rows are the signal tokens,
    # kept as peft's trainable-token deltas; the added rows' base values are rebuilt from
    # the config's seed. Without the name, the adapter holds only LoRA and those rows,
    # nothing is looked up, and tied embeddings (SmolLM2) do not reach safetensors as two
    # shared tensors.
    for adapter in peft_model.peft_config.values():
        adapter.base_model_name_or_path = None
    return peft_model


def _load_4bit(config: LanguageModelConfig):
    """The pretrained model quantised to 4 bits for QLoRA (``language_model.load_in_4bit``),
    ready for k-bit training; a clear error where that cannot run."""
    import importlib.util

    if not config.pretrained:
        raise ValueError("language_model.load_in_4bit quantises pretrained weights; language_model.pretrained is null")
    if not torch.cuda.is_available():
        raise ValueError("language_model.load_in_4bit needs a CUDA GPU (bitsandbytes' 4-bit kernels); none is visible")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("language_model.load_in_4bit needs bitsandbytes: pip install bitsandbytes")
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    source = converted_gguf_model(config) if config.gguf_file else resolve_pretrained(config.pretrained)
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.float16)
    model = AutoModelForCausalLM.from_pretrained(str(source), quantization_config=quantization,
                                                 device_map={"": torch.cuda.current_device()})
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


# ---------------------------------------------------------------------- merged inference
def merge_adapter(model: PeftModel) -> Callable[[], None]:
    """Fold the active adapter into the base weights for answering, and return the function
    that restores them exactly.

    Unmerged, every generated token pays for the adapter twice over: each LoRA layer adds
    its low-rank product, and peft's trainable-token layers rebuild the whole embedding
    matrix and LM head (``vocab x H``) to write the signal rows into them. Merged, the base
    layers already hold ``W + BA`` and the signal rows, and the model runs as fast as the
    plain base model.

    peft's own ``unmerge`` subtracts ``BA`` again, which leaves rounding in ``W``; here each
    LoRA layer keeps its original weight tensor (on the CPU when the model is not), and the
    signal rows come back from peft's saved originals, so training resumes on exactly the
    weights it left. Merging costs one extra copy of the LoRA-targeted weights on the CPU
    (q/k/v/o: about 110 MB for ``small``, 4.3 GB for ``paper`` in fp16)."""
    adapter = model.active_adapter
    originals: List[Tuple[nn.Module, torch.Tensor]] = []
    token_layers: List[TrainableTokensLayer] = []
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLayer) and adapter in module.lora_A and adapter not in module.merged_adapters:
                base = module.get_base_layer()
                weight = base.weight.data
                if not weight.is_floating_point():
                    raise ValueError(f"cannot merge the adapter into {type(base).__name__}'s quantised weights")
                delta = module.get_delta_weight(adapter).to(weight.dtype)
                originals.append((module, weight if weight.device.type == "cpu" else weight.to("cpu")))
                base.weight.data = weight + delta
                module.merged_adapters.append(adapter)
            elif isinstance(module, TrainableTokensLayer) and adapter in module.token_indices and not module.merged:
                module.merge(adapter_names=[adapter])
                token_layers.append(module)

    def restore() -> None:
        with torch.no_grad():
            for module, weight in originals:
                base = module.get_base_layer()
                base.weight.data = weight.to(base.weight.device)
                module.merged_adapters.remove(adapter)
            for module in token_layers:
                module.unmerge()

    return restore


# ---------------------------------------------------------------------- adapter files
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# The adapter_config.json fields that decide which tensors the adapter has and where they go.
_ADAPTER_FIELDS = ("peft_type", "r", "lora_alpha", "target_modules", "trainable_token_indices")


def adapter_state_dict(model: PeftModel) -> Dict[str, torch.Tensor]:
    """The trained tensors of the language model, keyed as peft saves them: the LoRA
    matrices and the signal tokens' embedding and LM-head rows (``trainable_tokens_delta``);
    never the whole embedding matrix (see :func:`build_language_model`)."""
    return get_peft_model_state_dict(model, save_embedding_layers=False)


def save_adapter(model: PeftModel, state: Dict[str, torch.Tensor], directory: Path, config: LanguageModelConfig) -> None:
    """Write ``state`` (:func:`adapter_state_dict`, on the CPU) and the adapter's config as
    a PEFT adapter folder: ``adapter_config.json`` and ``adapter_model.safetensors``, which
    ``PeftModel.from_pretrained(base, directory)`` loads onto the base language model whose
    embeddings hold the tokenizer's added tokens.

    ``PeftModel.save_pretrained`` would write the same two files, but it also writes a model
    card, and it records the base model's name in the live adapter config, after which
    peft's state dicts would carry the whole resized embedding matrix."""
    adapter = copy.deepcopy(model.peft_config["default"])
    adapter.inference_mode = True
    # Named only where transformers can load it as it is (not a packaged GGUF file).
    plain = config.pretrained and not config.gguf_file and not str(config.pretrained).startswith("package:")
    adapter.base_model_name_or_path = str(config.pretrained) if plain else None
    adapter.save_pretrained(str(directory))
    save_file(state, str(Path(directory) / ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})


def load_adapter_weights(directory: Union[str, Path]) -> Dict[str, torch.Tensor]:
    """The tensors of the PEFT adapter in ``directory``, keyed as :func:`adapter_state_dict`."""
    path = Path(directory) / ADAPTER_WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{Path(directory) / ADAPTER_CONFIG_NAME} has no weights beside it: {path.name} is missing")
    return load_file(str(path))


def check_adapter_config(model: PeftModel, directory: Union[str, Path]) -> None:
    """Refuse an ``adapter_config.json`` whose LoRA or token rows differ from those the
    model was built with from its own config (an adapter swapped in from elsewhere): a
    ``ValueError`` names the fields."""
    path = Path(directory) / ADAPTER_CONFIG_NAME
    saved = json.loads(path.read_text())
    built = model.peft_config["default"].to_dict()

    def normal(value):
        # JSON writes tuples and sets as lists; sets come back in any order.
        return sorted(value) if isinstance(value, (set, list, tuple)) and not isinstance(value, str) else value

    differ = [f for f in _ADAPTER_FIELDS if normal(saved.get(f)) != normal(built.get(f))]
    if differ:
        details = "; ".join(f"{f}: {saved.get(f)!r} there, {built.get(f)!r} from config.yaml" for f in differ)
        raise ValueError(f"{path} does not match the model that config.yaml builds ({details})")


# Text the builtin tokenizer learns its merges from: the prompt scaffolding and everyday
# conversational English, so tiny-preset sequences stay a few hundred tokens long.
_BUILTIN_CORPUS = """
speaker listener assistant user dialogue context response empathetic emotion emotions
firstly secondly thirdly fourthly finally the event scenario of this conversation is
the emotion of the speaker is the emotion cause is the goal to response is the response is
provide a multimodal empathetic response based on the given dialogue context below
think step by step before you answer what happened how the user feels why and what your reply should do
i feel really so very sad happy angry afraid scared surprised disgusted proud lonely anxious
that sounds hard i am sorry to hear that it must be tough for you what happened
my dog friend family job work school today yesterday week home car money trip
you are not alone i understand how you feel that is great news congratulations
"""


def _builtin_tokenizer() -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer trained on a fixed corpus, deterministic and offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _BUILTIN_CORPUS.split("\n")
    tok.train_from_iterator(corpus * 4 + [line.capitalize() for line in corpus], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
