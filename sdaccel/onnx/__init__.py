"""ONNX Runtime path: export each stage to ONNX, fuse, convert precision, and keep the result in a checked folder that
is a standard ONNX pipeline folder (diffusers' / Optimum's layout, plus sdaccel's manifest.json).

    sdaccel optimize --model synthetic:sd15 --out sd15-onnx --provider cuda --fp16

Modules (each small, importable without onnxruntime until it is used):
  export.py        stage functions -> ONNX graphs (legacy TorchScript exporter, opset 17, dynamic axes)
  graph.py         helpers over an onnx graph: producers/consumers, small constant evaluation, pruning
  capabilities.py  which com.microsoft ops (and input forms) the target execution provider can run
  fusions.py       onnxruntime.transformers' passes where they work, capability filtering, undo on refusal
  attention_fusion.py  sdaccel's own fusion: exported SDPA attention -> com.microsoft MultiHeadAttention
  precision.py     fp16/bf16 conversion with per-op fp32 exceptions (schema-driven, Resize-safe)
  sources.py       an ONNX pipeline folder another exporter wrote, as the source of the same optimization
  layout.py        the standard pipeline files around the graphs (model_index.json, configs, tokenizers, scheduler)
  manifest.py      manifest.json: versions, model digest, provider, precision, per-component facts; validation
  optimize.py      the driver: export -> fuse -> precision -> pipeline files -> manifest, staged then put in place
  output.py        `--out DIR`: what may be written where, the lock, moving the staged files in
  cli.py           `sdaccel optimize`
"""

from __future__ import annotations

COMPONENT_MODEL_TYPES = {"text_encoder": "clip", "text_encoder_2": "clip", "unet": "unet", "vae_decoder": "vae",
                         "vae_encoder": "vae"}
PRECISIONS = ("fp32", "fp16", "bf16")
PROVIDERS = ("cpu", "cuda")
# Fusions `--disable` accepts: onnxruntime.transformers' passes (fusions.ORT_FUSIONS), then sdaccel's own attention
# fusion and its packed input forms. Listed here so the CLI can name them without importing onnx.
ORT_FUSION_NAMES = ("layer_norm", "gelu", "bias_gelu", "skip_layer_norm", "bias_skip_layer_norm", "group_norm",
                    "skip_group_norm", "bias_split_gelu", "nhwc_conv", "bias_add")
OWN_FUSION_NAMES = ("attention", "packed_qkv", "packed_kv")
FUSION_NAMES = ORT_FUSION_NAMES + OWN_FUSION_NAMES

__all__ = ["COMPONENT_MODEL_TYPES", "FUSION_NAMES", "PRECISIONS", "PROVIDERS"]
