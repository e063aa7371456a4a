"""The bound of a bounded proof: how big the symbolic state is.

A bounded proof covers every state with at most ``gpu_blocks`` GPU blocks, ``cpu_blocks`` CPU
blocks, ``seqs`` sequence slots shared by ``groups`` requests, and block tables of at most
``table_len`` entries, with a block size of ``block_size`` tokens. Everything else (watermark,
max_num_seqs, max_model_len, token budget, prompt lengths, token counts) is symbolic, so one
proof covers every value of those.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from spec.errors import InputError


@dataclass(frozen=True)
class Bound:
    gpu_blocks: int = 4
    cpu_blocks: int = 3
    seqs: int = 3
    groups: int = 2
    table_len: int = 3
    block_size: int = 2

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"bound.{name}", f"must be an integer >= 1, got {value!r}")
        if self.groups > self.seqs:
            raise InputError("bound.groups", f"must be <= seqs ({self.seqs}), got {self.groups}")
        if self.gpu_blocks > 16 or self.cpu_blocks > 16 or self.seqs > 8 or self.table_len > 8:
            raise InputError("bound", "too large for a bounded proof (blocks <= 16, seqs <= 8, table_len <= 8)")

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in asdict(self).items())

    @classmethod
    def parse(cls, text: str, where: str = "--bound") -> Bound:
        """``"gpu_blocks=6,seqs=4"`` (unnamed fields keep their defaults) or a preset name."""
        text = text.strip()
        if text in PRESETS:
            return PRESETS[text]
        values: dict[str, int] = {}
        known = set(asdict(cls()).keys())
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise InputError(where, f"expected name=value or one of {', '.join(PRESETS)}, got {part!r}")
            key, _, raw = part.partition("=")
            key = key.strip()
            if key not in known:
                raise InputError(f"{where}.{key}", f"unknown bound (known: {', '.join(sorted(known))})")
            try:
                values[key] = int(raw)
            except ValueError:
                raise InputError(f"{where}.{key}", f"must be an integer, got {raw.strip()!r}") from None
        try:
            return cls(**values)
        except InputError as err:
            raise InputError(err.where.replace("bound", where, 1), err.message) from None


DEFAULT = Bound()
LARGE = Bound(gpu_blocks=6, cpu_blocks=4, seqs=4, groups=2, table_len=3, block_size=2)
PRESETS = {"default": DEFAULT, "large": LARGE}
