"""ONNX pipeline folders, the layout diffusers' ONNX pipelines and Optimum's ORT pipelines read:

    model_index.json                      what each sub-folder holds (class names)
    text_encoder/model.onnx [config.json] (text_encoder_2/ for SDXL; an SDXL refiner has text_encoder_2/ only)
    unet/model.onnx [weights.pb] [config.json]
    vae_decoder/model.onnx [config.json]   (vae_encoder/ too: diffusers' ONNX pipeline requires one)
    tokenizer/ (tokenizer_2/), scheduler/scheduler_config.json

`sdaccel optimize` writes such folders (plus its manifest.json); diffusers' converter script
(convert_stable_diffusion_checkpoint_to_onnx.py) and Optimum's exporter write them too. A model loaded from one has
no torch modules: its weights are the graphs, which the onnxruntime engine runs (Components.onnx_folder). The
architecture comes from the components' config.json files when the folder has them (sdaccel's and Optimum's do),
else from the UNet graph's inputs, its conv_in weight's shape and the scheduler's prediction type (diffusers'
converter writes no configs).

No sdaccel.onnx here: this module only reads JSON, tokenizers and (for folders without configs) graph inputs and shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .components import Components
from .configs import detect_arch, optional_json, read_json, spec_from_configs
from .registry import ModelSpec, TextEncoderSpec, get_spec, list_specs
from .tokenizer import folder_tokenizer

MODEL_INDEX = "model_index.json"
ONNX_MODEL_NAME = "model.onnx"  # diffusers' ONNX_WEIGHTS_NAME, Optimum's too
ONNX_EXTERNAL_DATA_NAME = "weights.pb"  # diffusers' ONNX_EXTERNAL_WEIGHTS_NAME
CONFIG_NAME = "config.json"
SCHEDULER_CONFIG = Path("scheduler") / "scheduler_config.json"


# Input and output names of each graph, as diffusers' ONNX pipelines (convert_stable_diffusion_checkpoint_to_onnx.py)
# and Optimum's ORT pipelines (SDXL) name them.
TEXT_INPUT = "input_ids"  # int32 in diffusers' exports
UNET_INPUTS = ("sample", "timestep", "encoder_hidden_states")
UNET_XL_INPUTS = ("text_embeds", "time_ids")
UNET_OUTPUT = "out_sample"
VAE_DECODER_INPUT, VAE_DECODER_OUTPUT = "latent_sample", "sample"
VAE_ENCODER_INPUT, VAE_ENCODER_OUTPUT = "sample", "latent_sample"  # diffusers' converter; SD1.x/SD2.x only


def text_encoder_output_names(te: TextEncoderSpec) -> list[str]:
    """CLIPTextModel: last_hidden_state, pooler_output; with projection: text_embeds, last_hidden_state; then, for an
    encoder conditioned on its penultimate layer (SDXL), every layer's hidden states as Optimum exports them."""
    first = ["text_embeds", "last_hidden_state"] if te.with_projection else ["last_hidden_state", "pooler_output"]
    layers = int(te.config["num_hidden_layers"])
    return first + ([f"hidden_states.{i}" for i in range(layers + 1)] if te.penultimate else [])


def text_encoder_outputs(te: TextEncoderSpec) -> tuple[str, str]:
    """(the hidden states the UNet attends to, the pooled embedding): the graph outputs sdaccel's text stage reads."""
    hidden = f"hidden_states.{int(te.config['num_hidden_layers']) - 1}" if te.penultimate else "last_hidden_state"
    return hidden, "text_embeds" if te.with_projection else "pooler_output"


def is_onnx_pipeline_folder(path: str | Path) -> bool:
    """Whether `path` is an ONNX pipeline folder: a model_index.json and unet/model.onnx (the file diffusers' and
    Optimum's ONNX pipelines load the UNet from). A torch diffusers folder has no unet/model.onnx."""
    folder = Path(path).expanduser()
    return (folder / MODEL_INDEX).is_file() and (folder / "unet" / ONNX_MODEL_NAME).is_file()


def folder_target(folder: str | Path) -> tuple[str | None, str | None]:
    """(provider, precision) an sdaccel-optimized folder's manifest records; None for what it does not say (no
    manifest, or one the onnxruntime engine will report as unreadable when it opens the folder)."""
    try:
        manifest = optional_json(Path(folder) / "manifest.json") or {}
    except ModelLoadError:
        return None, None
    provider, precision = manifest.get("provider"), manifest.get("precision")
    return (provider if isinstance(provider, str) else None,
            precision if precision in ("fp32", "fp16", "bf16") else None)


def _unet_graph(path: Path) -> tuple[dict[str, list], tuple[int, int] | None]:
    """The UNet graph's inputs (name -> dims: ints, or names for dynamic ones) and its conv_in weight's (output,
    input) channels (None when that weight is not a plain initializer), without reading its weights."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a damaged file, said in one line
        raise ModelLoadError(f"{path}: not a readable ONNX model ({exc.__class__.__name__})") from None
    inputs = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}  # dims are recorded even for external data
    conv_in = next((shapes.get(node.input[1]) for node in model.graph.node if node.op_type == "Conv"), None)
    return inputs, (int(conv_in[0]), int(conv_in[1])) if conv_in and len(conv_in) == 4 else None


def _spec_from_graphs(folder: Path, scheduler: dict[str, Any]) -> ModelSpec:
    """The registry architecture whose UNet takes what this folder's UNet graph takes (input channels: 9 for
    inpainting, context width, SDXL's pooled/time inputs), told apart by conv_in's width (tiny or not) and the
    scheduler's prediction type where those tie (SD2 768 vs base)."""
    inputs, conv_in = _unet_graph(folder / "unet" / ONNX_MODEL_NAME)
    sample, context = inputs.get("sample"), inputs.get("encoder_hidden_states")
    if not sample or not context or len(sample) != 4 or len(context) != 3 or not isinstance(context[2], int):
        raise ModelLoadError(f"{folder / 'unet' / ONNX_MODEL_NAME}: expected inputs sample (4-d) and "
                             f"encoder_hidden_states (3-d, fixed width) as diffusers exports them; has "
                             f"{', '.join(inputs)}")
    xl = "text_embeds" in inputs
    # diffusers' converter leaves the sample's channels dynamic: the first convolution's weight (conv_in) says.
    channels = sample[1] if isinstance(sample[1], int) else conv_in[1] if conv_in else None
    width = conv_in[0] if conv_in else None
    candidates = [s for s in list_specs() if s.is_xl == xl and s.unet["cross_attention_dim"] == context[2]
                  and channels in (None, s.unet_in_channels)]
    if not candidates:
        raise ModelLoadError(f"{folder}: no unet/config.json, and a UNet taking {context[2]}-wide context "
                             f"{'(SDXL) ' if xl else ''}and {channels or 'any number of'} input channels matches no "
                             "architecture sdaccel knows")
    vpred = scheduler.get("prediction_type") == "v_prediction"
    candidates.sort(key=lambda s: (width not in (None, s.unet["block_out_channels"][0]), s.is_inpaint,
                                   (s.scheduler["prediction_type"] == "v_prediction") != vpred, s.name == "sd21-base"))
    return candidates[0]


def folder_spec(folder: str | Path, arch: str | None = None) -> ModelSpec:
    """The architecture of an ONNX pipeline folder: its components' config.json files over the registry entry they
    match (`arch` forces the entry), or, without configs, the entry its UNet graph matches."""
    folder = Path(folder)
    scheduler = optional_json(folder / SCHEDULER_CONFIG) or {}
    unet = optional_json(folder / "unet" / CONFIG_NAME)
    if unet is None:
        base = get_spec(arch) if arch else _spec_from_graphs(folder, scheduler)
        return spec_from_configs(base, None, None, [None] * len(base.text_encoders), scheduler)
    try:
        base = get_spec(arch or detect_arch(unet, scheduler))
    except ModelLoadError as exc:
        raise ModelLoadError(f"{folder / 'unet' / CONFIG_NAME}: {exc}") from None
    vae = optional_json(folder / "vae_decoder" / CONFIG_NAME)
    encoders = [optional_json(folder / name / CONFIG_NAME) for name in base.text_encoder_names]
    return spec_from_configs(base, unet, vae, encoders, scheduler)


def load_onnx_pipeline_folder(folder: str | Path, *, arch: str | None = None) -> Components:
    """Components without torch modules for an ONNX pipeline folder: the architecture and the tokenizers, with
    `onnx_folder` naming the graphs the onnxruntime engine runs."""
    folder = Path(folder).expanduser()
    if not is_onnx_pipeline_folder(folder):
        raise ModelLoadError(f"{folder}: not an ONNX pipeline folder (no {MODEL_INDEX} and unet/{ONNX_MODEL_NAME})")
    read_json(folder / MODEL_INDEX)  # readable, or a one-line error now rather than from a pipeline later
    spec = folder_spec(folder, arch)
    tokenizers = [folder_tokenizer(folder, sub, te.pad_with_eos, int(te.config["vocab_size"]))
                  for sub, te in zip(spec.tokenizer_names, spec.text_encoders)]
    manifest = optional_json(folder / "manifest.json") or {}
    model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    return Components(spec=spec, unet=None, vae=None, text_encoders=[], tokenizers=tokenizers, source=str(folder),
                      synthetic=model.get("synthetic") is True, onnx_folder=folder)


# ------------------------------------------------------------------------------------------------ tokenizers


def _byte_level_chars() -> list[str]:
    """The 256 characters byte-level BPE maps bytes to, in CLIP's vocabulary order (GPT-2's bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(c) for c in printable] + [chr(256 + i) for i in range(len(others))]


def byte_level_clip_tokenizer(te_config: dict[str, Any], pad_with_eos: bool):
    """A transformers CLIPTokenizer for a model that ships none (synthetic weights): CLIP's byte-level vocabulary
    without merges (ids 0-511 as in CLIP's own, so every text is spelled out one byte per token) and BOS/EOS at the
    encoder's ids. A folder written with it loads in any pipeline that expects a CLIP tokenizer."""
    from transformers import CLIPTokenizer

    chars = _byte_level_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({f"{c}</w>": 256 + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = int(te_config["bos_token_id"])
    vocab["<|endoftext|>"] = int(te_config["eos_token_id"])
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token="<|endoftext|>" if pad_with_eos else "!",
                         model_max_length=int(te_config.get("max_position_embeddings", 77)))

