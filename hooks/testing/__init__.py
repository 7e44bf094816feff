"""Tiny random-weight VLMs and dummy inputs for tests (no downloads)."""

from .tiny import PIXEL_LAYOUTS, TINY_MODEL_TYPES, build_tiny_model, tiny_config, tiny_inputs, tiny_spec

__all__ = ["PIXEL_LAYOUTS", "TINY_MODEL_TYPES", "build_tiny_model", "tiny_config", "tiny_inputs", "tiny_spec"]
