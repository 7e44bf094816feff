"""The coordinate frames VLMs write boxes in, and which frame a model family uses.

HalluSegBench scores a box answer as a mask on the asked image's pixels
(:func:`evaluators.masks.answer_mask`). Production VLMs do not answer in those pixels:
each family writes the frame it was trained on, and reading one frame as another scores a
model's right boxes as wrong without a word (a Qwen2-VL box of ``(500, 500), (1000, 1000)``,
the lower-right quarter of any image, read as pixels of a 256-px image covers its lower-right
corner pixel only). The frames:

* ``pixels``: pixels of the asked image -- the toolkit's own convention, and the default for
  families with no trained box format.
* ``relative_1000``: each coordinate is a fraction of the image's width (x) or height (y)
  times 1000: Qwen2-VL (``(x0,y0),(x1,y1)``, its technical report), Qwen3-VL / Qwen3.5
  (``bbox_2d`` JSON), InternVL 2.5 / 3 (``<box>[[x0, y0, x1, y1]]</box>``) and GLM-4.1V /
  4.5V (``[x0,y0,x1,y1]``), as their model cards and cookbooks state.
* ``relative_1``: fractions of the image in [0, 1] (LLaVA-1.5's referring data writes
  ``[0.12, 0.34, 0.56, 0.78]``; not the default for ``llava``, whose checkpoints vary: pass
  ``--box_frame relative_1``).

Frames that say themselves which they are are read in any frame: the organism's coordinate
tokens ``<c3>`` (:func:`evaluators.answers.parse_box`) and PaliGemma's ``<loc0256>`` tokens
(1024 bins, ``y0 x0 y1 x1``, big_vision's PaliGemma README).

Qwen2.5-VL writes pixels of its *resized* input (``image_grid_thw`` x 14), which within its
pixel limits is the image rounded to multiples of 28 px; ``pixels`` reads it at most 14 px off
per side (under 6% of a 256-px suite image, under 2% of a 640 x 480 photo). Our choice: that
rounding is left, since the scoring sees only the answer text and the image, not the
processor's output.

:data:`MODEL_TYPE_FRAMES` is the per-family default (data, keyed by ``config.model_type``);
for a family not listed, the frame of the grounding format it is asked in
(:mod:`evaluators.grounding_formats`) applies, else pixels; ``vlm-eval`` / ``vlm-report``
``--box_frame`` overrides both for a checkpoint trained otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BoxFrame:
    """``scale``: what a coordinate of the whole image's width or height reads (None: pixels
    of the asked image)."""

    name: str
    scale: float | None

    def to_pixels(self, box: tuple[float, float, float, float], width: float, height: float
                  ) -> tuple[float, float, float, float]:
        """``box`` = (x0, y0, x1, y1) in this frame, in pixels of a ``width`` x ``height`` image."""
        if self.scale is None:
            return tuple(float(v) for v in box)  # type: ignore[return-value]
        sx, sy = width / self.scale, height / self.scale
        x0, y0, x1, y1 = box
        return (x0 * sx, y0 * sy, x1 * sx, y1 * sy)


BOX_FRAMES: dict[str, BoxFrame] = {}


def register_box_frame(frame: BoxFrame, overwrite: bool = False) -> BoxFrame:
    """Add ``frame`` to :data:`BOX_FRAMES` (a ``ValueError`` for a taken name unless ``overwrite``)."""
    if frame.name in BOX_FRAMES and not overwrite:
        raise ValueError(f"box frame {frame.name!r} is already registered (overwrite=True replaces it)")
    if frame.scale is not None and not frame.scale > 0:
        raise ValueError(f"box frame {frame.name!r}: scale must be positive, got {frame.scale!r}")
    BOX_FRAMES[frame.name] = frame
    return frame


for _frame in (BoxFrame("pixels", None), BoxFrame("relative_1000", 1000.0), BoxFrame("relative_1", 1.0)):
    register_box_frame(_frame)

DEFAULT_FRAME = "pixels"

#: ``config.model_type`` -> the frame its checkpoints write boxes in (the module docstring
#: gives each source); a family not listed writes ``pixels`` as far as we know.
MODEL_TYPE_FRAMES: dict[str, str] = {
    "paligemma": "pixels",  # its <loc> tokens say their own frame; numbers it would write, pixels
    "qwen2_vl": "relative_1000",
    "qwen2_5_vl": "pixels",  # of its resized input (the module docstring)
    "qwen3_vl": "relative_1000",
    "qwen3_vl_moe": "relative_1000",
    "qwen3_5": "relative_1000",
    "qwen3_5_moe": "relative_1000",
    "internvl": "relative_1000",
    "glm4v": "relative_1000",
    "glm4v_moe": "relative_1000",
    "glm46v": "relative_1000",
}


def get_box_frame(name: str) -> BoxFrame:
    """The registered frame ``name``; a ``ValueError`` naming the known ones otherwise."""
    if name not in BOX_FRAMES:
        from hooks.errors import unknown  # here: the CLIs check --box_frame before torch loads

        raise ValueError(unknown("box_frame", name, BOX_FRAMES))
    return BOX_FRAMES[name]


def model_type_of(model) -> str | None:
    """``model.config.model_type`` (None for a model without one): the key of the per-family tables."""
    return getattr(getattr(model, "config", None), "model_type", None)


def default_box_frame(model, fallback: str | None = None) -> str:
    """The frame ``model`` (a transformers model, or None) writes boxes in: its family's by
    ``config.model_type`` where the family is listed (the frame is the checkpoint's, whatever
    wording asks it), else ``fallback`` (the frame of the grounding format it is asked in),
    else pixels."""
    return MODEL_TYPE_FRAMES.get(model_type_of(model)) or fallback or DEFAULT_FRAME


__all__ = ["BOX_FRAMES", "BoxFrame", "DEFAULT_FRAME", "MODEL_TYPE_FRAMES", "default_box_frame", "get_box_frame",
           "model_type_of", "register_box_frame"]
