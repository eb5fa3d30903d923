"""What an augmentation may vary (``data.augment``): the spec's grammar and its named presets.

``data.augment`` is a job setting, so its grammar lives with the configuration: the config checks
parse it without loading the kernels that render the variants (:mod:`hogwild.data.augment`, which
draws and renders them from an :class:`AugmentSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass

PRESETS = {
    "none": "",
    "mnist": "translate=0.1,rotate=10,scale=0.9:1.1",
    "cifar": "translate=0.125,hflip",
    "imagenet": "crop=224,hflip,scale=0.875:1.15,rotate=5",
}
"""Named augmentation settings accepted by :meth:`AugmentSpec.parse`."""


@dataclass(frozen=True)
class AugmentSpec:
    """What may vary between the variants of an image.

    Attributes:
        translate: Largest shift, as a fraction of the image side (0.1: up to 10 %).
        hflip: Mirror left-right with probability 1/2.
        rotate: Largest rotation in degrees.
        scale: (smallest, largest) zoom factor.
        crop: Output (height, width), at most the input's; None keeps the input size.
        fill: Value of pixels that come from outside the source image (0..255).
    """

    translate: float = 0.0
    hflip: bool = False
    rotate: float = 0.0
    scale: tuple[float, float] = (1.0, 1.0)
    crop: tuple[int, int] | None = None
    fill: int = 0

    def __post_init__(self) -> None:
        lo, hi = self.scale
        if not (0 <= self.translate <= 1 and 0 <= self.rotate <= 180 and 0 < lo <= hi):
            raise ValueError(
                f"augmentation out of range: translate {self.translate} (0..1), rotate "
                f"{self.rotate} (0..180 degrees), scale {self.scale} (0 < min <= max)"
            )
        if self.crop is not None and min(self.crop) < 1:
            raise ValueError(f"crop must be positive (height, width), got {self.crop}")
        if not 0 <= self.fill <= 255:
            raise ValueError(f"fill must be 0..255, got {self.fill}")

    @property
    def random(self) -> bool:
        """Whether any parameter varies (a crop alone varies its position)."""
        return bool(
            self.translate or self.hflip or self.rotate or self.scale != (1.0, 1.0) or self.crop
        )

    def output_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of an augmented image of ``shape`` (H, W) or (H, W, C).

        Raises:
            ValueError: The crop is larger than the image.
        """
        if self.crop is None:
            return tuple(shape)
        if self.crop[0] > shape[0] or self.crop[1] > shape[1]:
            raise ValueError(f"crop {list(self.crop)} is larger than the image {list(shape[:2])}")
        return (*self.crop, *shape[2:])

    @classmethod
    def parse(cls, text: str) -> AugmentSpec:
        """Parse ``"translate=0.1,hflip,rotate=15,scale=0.9:1.1,crop=24,fill=0"`` or a preset.

        ``crop`` takes ``S`` or ``HxW``; a preset name (:data:`PRESETS`) may start the list and
        be amended: ``"mnist,rotate=5"``.

        Raises:
            ValueError: An unknown key or preset, or a value out of range.
        """
        fields: dict = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            if item in PRESETS:
                fields.update(vars(cls.parse(PRESETS[item])) if PRESETS[item] else {})
                continue
            key, _, value = item.partition("=")
            try:
                if key == "hflip":
                    fields["hflip"] = value.lower() not in ("0", "false", "no")
                elif key in ("translate", "rotate"):
                    fields[key] = float(value)
                elif key == "fill":
                    fields["fill"] = int(value)
                elif key == "scale":
                    lo, _, hi = value.partition(":")
                    fields["scale"] = (float(lo), float(hi or lo))
                elif key == "crop":
                    h, _, w = value.lower().partition("x")
                    fields["crop"] = (int(h), int(w or h))
                else:
                    raise ValueError(
                        f"unknown augmentation {key!r}: expected translate, hflip, rotate, scale, "
                        f"crop, fill or a preset ({', '.join(PRESETS)})"
                    )
            except (TypeError, ValueError) as exc:
                if "augmentation" in str(exc):
                    raise
                raise ValueError(f"bad augmentation {item!r}: {exc}") from None
        return cls(**fields)
