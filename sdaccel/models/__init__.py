"""Model architectures as data (registry), their modules (components) and how they are loaded."""

from .components import Components
from .loading import SYNTHETIC_PREFIX, build_synthetic, load_components
from .registry import ModelSpec, TextEncoderSpec, get_spec, list_specs

__all__ = ["Components", "ModelSpec", "TextEncoderSpec", "SYNTHETIC_PREFIX", "build_synthetic", "get_spec",
           "list_specs", "load_components"]
