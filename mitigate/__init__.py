"""Decoding-time hallucination mitigations attached to unmodified HF VLMs through :mod:`hooks`.

Planned (issues 4-6): visual contrastive decoding, prior-token suppression, crop-and-verify.
Nothing here is implemented yet.
"""
