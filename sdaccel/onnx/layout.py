"""The files around the graphs that make an optimized folder a standard ONNX pipeline folder (models.onnx_folder):
model_index.json, each component's config.json, the tokenizers and the scheduler's config.

SD1.x/SD2.x folders are what diffusers' OnnxStableDiffusionPipeline loads (model_index.json naming OnnxRuntimeModel
components, as convert_stable_diffusion_checkpoint_to_onnx.py writes it; no VAE encoder, no safety checker). SDXL has
no diffusers ONNX pipeline: its folder follows Optimum's export (the torch pipeline's model_index.json, a config.json
beside every graph), which ORTStableDiffusionXLPipeline loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..models.onnx_folder import CONFIG_NAME, MODEL_INDEX, SCHEDULER_CONFIG
from ..models.tokenizer import HFTokenizerAdapter


def model_index(spec, scheduler_class: str, with_vae_encoder: bool) -> dict:
    import diffusers

    common = {"_diffusers_version": diffusers.__version__, "feature_extractor": [None, None],
              "scheduler": ["diffusers", scheduler_class]}
    if spec.is_xl:
        index = {**common, "_class_name": "StableDiffusionXLPipeline", "force_zeros_for_empty_prompt": True,
                 "image_encoder": [None, None], "text_encoder": ["transformers", "CLIPTextModel"],
                 "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
                 "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
                 "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}
        if spec.aesthetic_score:  # the refiner: bigG alone, as text_encoder_2 (its published folder's layout)
            index.update(_class_name="StableDiffusionXLImg2ImgPipeline", requires_aesthetics_score=True,
                         force_zeros_for_empty_prompt=spec.zeros_for_empty_negative, text_encoder=[None, None],
                         tokenizer=[None, None])
        return index
    return {**common, "_class_name": "OnnxStableDiffusionPipeline", "requires_safety_checker": False,
            "safety_checker": [None, None], "text_encoder": ["diffusers", "OnnxRuntimeModel"],
            "tokenizer": ["transformers", "CLIPTokenizer"], "unet": ["diffusers", "OnnxRuntimeModel"],
            "vae_decoder": ["diffusers", "OnnxRuntimeModel"],
            "vae_encoder": ["diffusers", "OnnxRuntimeModel"] if with_vae_encoder else [None, None]}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_component_configs(folder: Path, spec, names) -> dict[str, str]:
    """config.json beside each graph (Optimum requires one; diffusers ignores it): the UNet's and the VAE's diffusers
    configs (the VAE's in vae_decoder/ and vae_encoder/) and each text encoder's transformers config, from the
    model's spec, for the components `names`. Returns component -> file name."""
    import diffusers
    from transformers import CLIPTextConfig

    version = {"_diffusers_version": diffusers.__version__}
    _write_json(folder / "unet" / CONFIG_NAME, {"_class_name": "UNet2DConditionModel", **version, **spec.unet})
    for name in {"vae_decoder", "vae_encoder"} & set(names):
        _write_json(folder / name / CONFIG_NAME, {
            "_class_name": "AutoencoderKL", **version, **spec.vae, "scaling_factor": spec.vae_scaling_factor,
            "force_upcast": spec.vae_force_upcast})
    for name, te in zip(spec.text_encoder_names, spec.text_encoders):
        config = CLIPTextConfig.from_dict(dict(te.config))
        config.architectures = ["CLIPTextModelWithProjection" if te.with_projection else "CLIPTextModel"]
        (folder / name).mkdir(parents=True, exist_ok=True)
        config.to_json_file(str(folder / name / CONFIG_NAME))
    return {name: CONFIG_NAME for name in names}


def write_pipeline_files(folder: Path, components, names) -> list[str]:
    """model_index.json (for the components `names`), scheduler/scheduler_config.json and tokenizer(_2)/ into
    `folder`. Returns the files written,
    relative to it. A model without a real tokenizer (synthetic weights) gets a byte-level CLIP tokenizer
    (models.onnx_folder.byte_level_clip_tokenizer), so the folder loads wherever a CLIP tokenizer is expected."""
    from ..models.onnx_folder import byte_level_clip_tokenizer
    from ..models.schedulers import make_scheduler

    spec = components.spec
    scheduler = make_scheduler(spec.default_scheduler, spec.scheduler)
    scheduler.save_config(str(folder / SCHEDULER_CONFIG.parent))
    _write_json(folder / MODEL_INDEX, model_index(spec, type(scheduler).__name__, "vae_encoder" in names))
    for sub, te, tokenizer in zip(spec.tokenizer_names, spec.text_encoders, components.tokenizers):
        hf = tokenizer.tokenizer if isinstance(tokenizer, HFTokenizerAdapter) else \
            byte_level_clip_tokenizer(te.config, te.pad_with_eos)
        hf.save_pretrained(str(folder / sub))
    written = [MODEL_INDEX, SCHEDULER_CONFIG.as_posix()]
    for sub in spec.tokenizer_names:
        written += sorted(f"{sub}/{name}" for name in os.listdir(folder / sub) if (folder / sub / name).is_file())
    return written
