"""Tiny random-weight VLMs, their image processors and dummy inputs for tests (no downloads);
for some families, whole checkpoint folders with the family's processor (``processors``)."""

from .tiny import (
    PIXEL_LAYOUTS, TINY_MODEL_TYPES, build_tiny_model, tiny_config, tiny_image_features, tiny_image_processor,
    tiny_inputs, tiny_pixel_input_names, tiny_preprocess, tiny_spec, tiny_spec_name, tiny_adapter,
)
from .processors import PROCESSOR_SPECS, TINY_PROCESSOR_TYPES, save_tiny_checkpoint, tiny_processor
from .tokenizers import WordIds, trained_tokenizers

__all__ = [
    "PIXEL_LAYOUTS", "TINY_MODEL_TYPES", "build_tiny_model", "tiny_config", "tiny_image_features",
    "tiny_image_processor", "tiny_inputs", "tiny_pixel_input_names", "tiny_preprocess", "tiny_spec", "tiny_spec_name", "tiny_adapter", "PROCESSOR_SPECS", "TINY_PROCESSOR_TYPES",
    "save_tiny_checkpoint", "tiny_processor", "trained_tokenizers", "WordIds",
]
