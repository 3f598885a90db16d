"""Model families as data: architectures, default settings, and the configs diffusers/transformers build from.

Each entry carries the exact component configs of the published checkpoint (so `synthetic:<name>` builds the
real architecture with random weights), or small widths for the `-tiny` variants that the tests and CPU runs use.
The tiny variants go through the very same code paths: only numbers differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UsageError

# Scheduler settings shared by every SD family's training run.
_SD_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    steps_offset=1,
    clip_sample=False,
    set_alpha_to_one=False,
    timestep_spacing="leading",
)

_CLIP_TOKENS = dict(vocab_size=49408, max_position_embeddings=77, bos_token_id=49406, eos_token_id=49407)

# CLIP ViT-L/14 text tower (SD1.x; first SDXL encoder).
_CLIP_L = dict(
    _CLIP_TOKENS, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    hidden_act="quick_gelu", projection_dim=768, pad_token_id=1,
)
# OpenCLIP ViT-H/14 text tower as diffusers ships it for SD2.x: 23 of 24 layers (SD2 conditions on the penultimate).
_OPENCLIP_H = dict(
    _CLIP_TOKENS, hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16,
    hidden_act="gelu", projection_dim=512, pad_token_id=1,
)
# OpenCLIP ViT-bigG/14 text tower (second SDXL encoder, with projection for the pooled embedding).
_OPENCLIP_BIGG = dict(
    _CLIP_TOKENS, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
    hidden_act="gelu", projection_dim=1280, pad_token_id=1,
)

_SD_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, norm_num_groups=32,
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
)

_SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32,
)
# SD2.x: linear projections in the transformer blocks and 64-wide heads (5/10/20/20 heads per level).
_SD21_UNET = dict(
    _SD15_UNET, sample_size=96, cross_attention_dim=1024, attention_head_dim=(5, 10, 20, 20),
    use_linear_projection=True,
)
_SDXL_UNET = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20), cross_attention_dim=2048,
    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816, norm_num_groups=32,
)
# The SDXL refiner: wider and four levels deep, conditioned on OpenCLIP-bigG alone (1280) and on 5 time ids
# (original size, crop, aesthetic score): 1280 + 5 * 256 = 2560 added-embedding inputs.
_SDXL_REFINER_UNET = dict(
    _SDXL_UNET, block_out_channels=(384, 768, 1536, 1536),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    transformer_layers_per_block=4, attention_head_dim=(6, 12, 24, 24), cross_attention_dim=1280,
    projection_class_embeddings_input_dim=2560,
)
INPAINT_CHANNELS = 9  # an inpainting UNet's input: latents (4), mask (1), latents of the masked image (4)


@dataclass(frozen=True)
class TextEncoderSpec:
    """One CLIP text tower. `penultimate`: condition on hidden_states[-2] (SDXL) instead of the final output."""

    config: dict[str, Any]
    with_projection: bool = False  # CLIPTextModelWithProjection: its `text_embeds` is SDXL's pooled embedding
    penultimate: bool = False
    pad_with_eos: bool = True  # CLIP-L pads with <|endoftext|>; OpenCLIP towers pad with id 0 ("!")


@dataclass(frozen=True)
class ModelSpec:
    """Everything sdaccel needs to know about one model family, independent of where weights come from."""

    name: str
    family: str  # "sd1", "sd2" or "sdxl": selects conditioning code paths
    unet: dict[str, Any]
    vae: dict[str, Any]
    text_encoders: tuple[TextEncoderSpec, ...]
    scheduler: dict[str, Any]
    vae_scaling_factor: float = 0.18215
    vae_force_upcast: bool = False  # SDXL's VAE overflows in fp16: decode in fp32 unless told otherwise
    upcast_attention: bool = False  # SD2.1 at 768 gives NaN in fp16 attention unless softmax runs in fp32
    height: int = 512
    width: int = 512
    steps: int = 50
    guidance: float = 7.5
    default_scheduler: str = "pndm"
    description: str = ""
    tiny: bool = False
    aliases: tuple[str, ...] = field(default=())
    # SDXL conditioning: the refiner's time ids end in an aesthetic score instead of the target size, and it takes
    # the embedding of "" (not zeros) as the unconditional input, as its published pipeline config says.
    aesthetic_score: bool = False
    zeros_for_empty_negative: bool = True

    @property
    def unet_in_channels(self) -> int:
        return int(self.unet.get("in_channels", 4))

    @property
    def is_inpaint(self) -> bool:
        """A UNet that takes the mask and the masked image's latents beside the latents (9 input channels)."""
        return self.unet_in_channels == INPAINT_CHANNELS

    @property
    def is_refiner(self) -> bool:
        """The SDXL refiner: one text encoder (OpenCLIP bigG, the base model's second), aesthetic-score time ids."""
        return self.is_xl and self.aesthetic_score

    @property
    def needs_image(self) -> bool:
        """A refiner refines an image (or a base model's latents); it does not start one."""
        return self.is_refiner

    @property
    def is_xl(self) -> bool:
        return self.family == "sdxl"

    @property
    def latent_channels(self) -> int:
        return int(self.vae.get("latent_channels", 4))

    @property
    def vae_scale(self) -> int:
        """Pixels per latent cell: 2 ** (number of VAE down blocks - 1)."""
        return 2 ** (len(self.vae["block_out_channels"]) - 1)

    @property
    def text_encoder_names(self) -> list[str]:
        """text_encoder, text_encoder_2, ...: the sub-folders (and LoRA prefixes) of the text encoders, in order."""
        return [f"text_encoder{suffix}" for suffix in self._folder_suffixes()]

    @property
    def tokenizer_names(self) -> list[str]:
        """tokenizer, tokenizer_2, ...: the tokenizers' sub-folders, in the text encoders' order."""
        return [f"tokenizer{suffix}" for suffix in self._folder_suffixes()]

    def _folder_suffixes(self) -> list[str]:
        # "", "_2", ...: an SDXL refiner's one encoder (OpenCLIP bigG) is the base model's second, and diffusers' and
        # Optimum's refiner folders keep it in text_encoder_2/ and tokenizer_2/ with no text_encoder/.
        first = 1 if self.is_refiner else 0
        return ["" if i == 0 else f"_{i + 1}" for i in range(first, first + len(self.text_encoders))]


def _tiny_text(**overrides: Any) -> dict[str, Any]:
    base = dict(_CLIP_TOKENS, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                hidden_act="gelu", projection_dim=32, pad_token_id=1)
    return {**base, **overrides}


_TINY_VAE = dict(_SD_VAE, block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8,
                 down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
_TINY_UNET = dict(
    sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32, attention_head_dim=2, norm_num_groups=8,
)

_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="sd15", family="sd1", unet=_SD15_UNET, vae=_SD_VAE, text_encoders=(TextEncoderSpec(_CLIP_L),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), aliases=("sd14", "sd1", "sd1.5", "sd1.4"),
        description="Stable Diffusion 1.x (1.4/1.5): CLIP-L, 512x512",
    ),
    ModelSpec(
        name="sd21", family="sd2", unet=dict(_SD21_UNET, upcast_attention=True), vae=_SD_VAE,
        text_encoders=(TextEncoderSpec(_OPENCLIP_H, pad_with_eos=False),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="v_prediction"), upcast_attention=True,
        height=768, width=768, default_scheduler="ddim", aliases=("sd2", "sd2.1", "sd20"),
        description="Stable Diffusion 2.x 768 (v-prediction, attention upcast): OpenCLIP-H, 768x768",
    ),
    ModelSpec(
        name="sd21-base", family="sd2", unet=dict(_SD21_UNET, sample_size=64), vae=_SD_VAE,
        text_encoders=(TextEncoderSpec(_OPENCLIP_H, pad_with_eos=False),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), default_scheduler="ddim",
        aliases=("sd2-base", "sd2.1-base"), description="Stable Diffusion 2.x base (epsilon): OpenCLIP-H, 512x512",
    ),
    ModelSpec(
        name="sdxl", family="sdxl", unet=_SDXL_UNET, vae=dict(_SD_VAE, sample_size=1024),
        text_encoders=(
            TextEncoderSpec(_CLIP_L, penultimate=True),
            TextEncoderSpec(_OPENCLIP_BIGG, with_projection=True, penultimate=True, pad_with_eos=False),
        ),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), vae_scaling_factor=0.13025,
        vae_force_upcast=True, height=1024, width=1024, steps=30, guidance=5.0, default_scheduler="euler",
        aliases=("sdxl-base", "xl", "sdxl1.0"), description="Stable Diffusion XL base 1.0: CLIP-L + OpenCLIP-bigG, 1024x1024",
    ),
    ModelSpec(
        name="sdxl-refiner", family="sdxl", unet=_SDXL_REFINER_UNET, vae=dict(_SD_VAE, sample_size=1024),
        text_encoders=(
            TextEncoderSpec(_OPENCLIP_BIGG, with_projection=True, penultimate=True, pad_with_eos=False),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), vae_scaling_factor=0.13025,
        vae_force_upcast=True, height=1024, width=1024, steps=50, guidance=5.0, default_scheduler="euler",
        aesthetic_score=True, zeros_for_empty_negative=False, aliases=("refiner", "sdxl-refiner-1.0"),
        description="Stable Diffusion XL refiner 1.0 (image to image, aesthetic score): OpenCLIP-bigG, 1024x1024",
    ),
    # Tiny variants: same families and code paths, widths small enough for CPU tests in seconds.
    ModelSpec(
        name="sd15-tiny", family="sd1", unet=_TINY_UNET, vae=_TINY_VAE,
        text_encoders=(TextEncoderSpec(_tiny_text(hidden_act="quick_gelu")),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), height=64, width=64, steps=4, tiny=True,
        description="tiny SD1.x-shaped model for tests and CPU",
    ),
    ModelSpec(
        name="sd21-tiny", family="sd2", unet=dict(_TINY_UNET, use_linear_projection=True, upcast_attention=True),
        vae=_TINY_VAE, text_encoders=(TextEncoderSpec(_tiny_text(), pad_with_eos=False),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="v_prediction"), upcast_attention=True,
        height=64, width=64, steps=4, default_scheduler="ddim", tiny=True,
        description="tiny SD2.x-shaped model (v-prediction) for tests and CPU",
    ),
    ModelSpec(
        name="sdxl-tiny", family="sdxl",
        unet=dict(
            _TINY_UNET, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=(1, 2),
            cross_attention_dim=32 + 48, use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=8, projection_class_embeddings_input_dim=48 + 6 * 8,
        ),
        vae=_TINY_VAE,
        text_encoders=(
            TextEncoderSpec(_tiny_text(), penultimate=True),
            # A different width from the first encoder, as in the real model (converters tell them apart by it).
            TextEncoderSpec(_tiny_text(hidden_size=48, projection_dim=48), with_projection=True, penultimate=True,
                            pad_with_eos=False),
        ),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), vae_scaling_factor=0.13025,
        vae_force_upcast=True, height=64, width=64, steps=4, guidance=5.0, default_scheduler="euler", tiny=True,
        description="tiny SDXL-shaped model (two encoders, pooled + time ids) for tests and CPU",
    ),
    ModelSpec(
        name="sdxl-refiner-tiny", family="sdxl",
        unet=dict(
            _TINY_UNET, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=2,
            cross_attention_dim=48, use_linear_projection=True, addition_embed_type="text_time",
            addition_time_embed_dim=8, projection_class_embeddings_input_dim=48 + 5 * 8,
        ),
        vae=_TINY_VAE,
        text_encoders=(TextEncoderSpec(_tiny_text(hidden_size=48, projection_dim=48), with_projection=True,
                                       penultimate=True, pad_with_eos=False),),
        scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"), vae_scaling_factor=0.13025,
        vae_force_upcast=True, height=64, width=64, steps=4, guidance=5.0, default_scheduler="euler", tiny=True,
        aesthetic_score=True, zeros_for_empty_negative=False,
        description="tiny SDXL-refiner-shaped model (one encoder, aesthetic score) for tests and CPU",
    ),
)


def _inpainting(spec: ModelSpec, name: str, aliases: tuple[str, ...], description: str,
                unet: dict[str, Any] | None = None, **changes: Any) -> ModelSpec:
    """The inpainting fine-tune of `spec`: the same model with a 9-channel UNet input (inpaint/mask conditioning)."""
    return replace(spec, name=name, unet=dict(spec.unet, in_channels=INPAINT_CHANNELS, **(unet or {})),
                   aliases=aliases, description=description, **changes)


_BY_NAME = {s.name: s for s in _SPECS}
_SPECS += (
    _inpainting(_BY_NAME["sd15"], "sd15-inpaint", ("sd1.5-inpaint", "sd-inpainting"),
                "Stable Diffusion 1.5 inpainting (9-channel UNet): CLIP-L, 512x512"),
    # stabilityai/stable-diffusion-2-inpainting: the 512 base UNet (epsilon), attention not upcast.
    _inpainting(_BY_NAME["sd21-base"], "sd2-inpaint", ("sd21-inpaint", "sd2.1-inpaint"),
                "Stable Diffusion 2 inpainting (9-channel UNet, epsilon): OpenCLIP-H, 512x512"),
    _inpainting(_BY_NAME["sdxl"], "sdxl-inpaint", ("sdxl-inpainting", "xl-inpaint"),
                "Stable Diffusion XL 1.0 inpainting 0.1 (9-channel UNet): CLIP-L + OpenCLIP-bigG, 1024x1024"),
    _inpainting(_BY_NAME["sd15-tiny"], "sd15-inpaint-tiny", (), "tiny SD1.x inpainting model for tests and CPU"),
    _inpainting(_BY_NAME["sd21-tiny"], "sd2-inpaint-tiny", (), "tiny SD2.x inpainting model for tests and CPU",
                unet=dict(upcast_attention=False), scheduler=dict(_SD_SCHEDULER, prediction_type="epsilon"),
                upcast_attention=False),
    _inpainting(_BY_NAME["sdxl-tiny"], "sdxl-inpaint-tiny", (), "tiny SDXL inpainting model for tests and CPU"),
)



@dataclass(frozen=True)
class ControlNetSpec:
    """A ControlNet architecture: the down and mid blocks of `base`'s UNet (same widths, attention, time and added
    conditioning) plus the control image's embedding, which downsamples the image to the latent grid."""

    name: str
    base: str  # the registry entry whose UNet it mirrors (any model of that family and width pairs with it)
    description: str
    tiny: bool = False

    @property
    def config(self) -> dict[str, Any]:
        """diffusers ControlNetModel's config (as ControlNetModel.from_unet derives it from the UNet's): the input
        takes the latents alone, even beside a 9-channel inpainting UNet."""
        import inspect

        from diffusers import ControlNetModel

        base = get_spec(self.base)
        accepted = set(inspect.signature(ControlNetModel.__init__).parameters) - {"self"}
        config = {k: v for k, v in base.unet.items() if k in accepted}
        # One stride-2 stage per VAE downsampling: the published (16, 32, 96, 256) for an 8x VAE.
        stages = len(base.vae["block_out_channels"])
        widths = (16, 32, 96, 256)[:stages] if stages <= 4 else (16, 32, 96, 256)
        return dict(config, in_channels=base.latent_channels, conditioning_channels=3,
                    conditioning_embedding_out_channels=widths)


CONTROLNET_SPECS: tuple[ControlNetSpec, ...] = (
    ControlNetSpec("controlnet-sd15", "sd15", "ControlNet for Stable Diffusion 1.x (lllyasviel's layout)"),
    ControlNetSpec("controlnet-sd21", "sd21", "ControlNet for Stable Diffusion 2.x"),
    ControlNetSpec("controlnet-sdxl", "sdxl", "ControlNet for Stable Diffusion XL (diffusers' full-size layout)"),
    ControlNetSpec("controlnet-sd15-tiny", "sd15-tiny", "tiny SD1.x ControlNet for tests and CPU", tiny=True),
    ControlNetSpec("controlnet-sd21-tiny", "sd21-tiny", "tiny SD2.x ControlNet for tests and CPU", tiny=True),
    ControlNetSpec("controlnet-sdxl-tiny", "sdxl-tiny", "tiny SDXL ControlNet for tests and CPU", tiny=True),
)


def get_controlnet_spec(name: str) -> ControlNetSpec:
    key = name.strip().lower()
    for spec in CONTROLNET_SPECS:
        if key == spec.name:
            return spec
    raise UsageError(f"unknown ControlNet architecture {name!r}; known: "
                     f"{', '.join(s.name for s in CONTROLNET_SPECS)}")

def default_model(device_type: str) -> str:
    """What commands run when no model is named: SD1.5's exact architecture on a GPU, its tiny twin on a CPU."""
    return "synthetic:sd15" if device_type == "cuda" else "synthetic:sd15-tiny"


def list_specs() -> tuple[ModelSpec, ...]:
    return _SPECS


def get_spec(name: str) -> ModelSpec:
    key = name.strip().lower()
    for spec in _SPECS:
        if key == spec.name or key in spec.aliases:
            return spec
    names = ", ".join(s.name for s in _SPECS)
    raise UsageError(f"unknown model architecture {name!r}; known: {names}")


def with_overrides(spec: ModelSpec, **changes: Any) -> ModelSpec:
    return replace(spec, **changes)
