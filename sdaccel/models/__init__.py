"""Model architectures as data (registry), their modules (components) and how they are loaded."""

from .components import Components
from .loading import SYNTHETIC_PREFIX, build_synthetic, load_components
from .onnx_folder import is_onnx_pipeline_folder
from .registry import ModelSpec, TextEncoderSpec, get_spec, list_specs

__all__ = ["Components", "ModelSpec", "TextEncoderSpec", "SYNTHETIC_PREFIX", "build_synthetic", "get_spec",
           "is_onnx_pipeline_folder", "list_specs", "load_components"]
