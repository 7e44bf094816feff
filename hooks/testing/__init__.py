"""Tiny random-weight VLMs, their image processors and dummy inputs for tests (no downloads)."""

from .tiny import (
    PIXEL_LAYOUTS, TINY_MODEL_TYPES, build_tiny_model, tiny_config, tiny_image_features, tiny_image_processor,
    tiny_inputs, tiny_spec,
)

__all__ = [
    "PIXEL_LAYOUTS", "TINY_MODEL_TYPES", "build_tiny_model", "tiny_config", "tiny_image_features",
    "tiny_image_processor", "tiny_inputs", "tiny_spec",
]
