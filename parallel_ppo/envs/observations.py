"""`Dict` observations (a camera image and the robot's state, say) as one row of bytes: every key's value packed
side by side, vectors as float32 first and then images as uint8, so that everything between the env and the
network (the rollout buffer, shared memory, workers, minibatches, checkpoints) handles one array as it does for
a Box observation, and images stay uint8 all the way. The network unpacks the row by the layout (`unpack`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

FLOAT_BYTES = 4


@dataclass(frozen=True)
class Part:
    """One key of a dict observation: a uint8 (H, W, C) image or a float32 vector, at `offset` bytes in the row."""

    key: str
    shape: tuple[int, ...]
    image: bool
    offset: int
    source_shape: tuple[int, ...] = ()
    """The shape the env gives a vector key in (a scalar's is ()); its values are packed flattened, as `shape`."""

    @property
    def size(self) -> int:
        """Values (not bytes) it holds."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * (1 if self.image else FLOAT_BYTES)


@dataclass(frozen=True)
class DictLayout:
    """Where each key of a dict observation sits in its packed row of `nbytes` bytes."""

    parts: tuple[Part, ...]
    nbytes: int

    @classmethod
    def of(cls, keys: dict[str, tuple[tuple[int, ...], bool]]) -> DictLayout:
        """The layout of `{key: (shape, is_image)}` (a vector key's shape as the env gives it): the vectors first
        (so each float32 starts on a multiple of 4 bytes), then the images, each group in key order; the row padded
        to a multiple of 4 bytes."""
        parts, offset = [], 0
        for image in (False, True):
            for key in sorted(k for k, (_, is_image) in keys.items() if is_image == image):
                shape = tuple(int(d) for d in keys[key][0])
                packed = shape if image else (math.prod(shape),)
                part = Part(key, packed, image, offset, shape)
                parts.append(part)
                offset += part.nbytes
        return cls(tuple(parts), -(-offset // FLOAT_BYTES) * FLOAT_BYTES)

    @property
    def images(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if p.image)

    @property
    def vectors(self) -> tuple[Part, ...]:
        return tuple(p for p in self.parts if not p.image)

    @property
    def vector_size(self) -> int:
        """The float32 values of every vector key together (the `(vector_size,)` the network's MLP reads)."""
        return sum(p.size for p in self.vectors)

    def pack(self, obs: dict[str, Any], batched: bool = True, needed: tuple[str, ...] | None = None) -> np.ndarray:
        """`{key: array (N, *shape)}` as uint8 rows (N, nbytes); one observation `{key: array shape}` as one row
        when not `batched`. With `needed`, the other keys may be missing (their bytes left 0). ValueError naming a
        missing key or a value of the wrong size."""
        needed = tuple(p.key for p in self.parts) if needed is None else needed
        missing = [key for key in needed if key not in obs]
        if missing:
            raise ValueError(f"the observation lacks the key(s) {', '.join(missing)} (it has {', '.join(sorted(obs))})")
        if not batched:
            return self.pack({key: np.asarray(value)[None] for key, value in obs.items()}, needed=needed)[0]
        given = [p for p in self.parts if p.key in obs]
        if not given:
            raise ValueError("the observation has none of the keys " + ", ".join(p.key for p in self.parts))
        first = np.asarray(obs[given[0].key])
        if first.ndim == 0:
            raise ValueError(f"observation key {given[0].key!r} is one value, not a batch of them")
        n = len(first)
        rows = np.zeros((n, self.nbytes), dtype=np.uint8)
        for part in given:
            value = np.asarray(obs[part.key])
            if not _fits(value.shape, n, part):
                raise ValueError(f"observation key {part.key!r} has shape {value.shape}, not "
                                 f"{(n, *part.source_shape)}")
            flat = np.ascontiguousarray(value.reshape(n, part.size), dtype=np.uint8 if part.image else np.float32)
            rows[:, part.offset:part.offset + part.nbytes] = flat.view(np.uint8)
        return rows

    def unpack(self, rows: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """uint8 rows (B, nbytes) → each image key's uint8 (B, H, W, C), and the vector keys' float32 values side by
        side (B, vector_size)."""
        rows = rows.contiguous()
        images = {p.key: rows[:, p.offset:p.offset + p.nbytes].reshape(-1, *p.shape) for p in self.images}
        return images, self.vector_values(rows)

    def vector_values(self, rows: torch.Tensor) -> torch.Tensor:
        """The vector keys' float32 values side by side, (..., vector_size), of contiguous uint8 rows (..., nbytes):
        they lead each row."""
        end = sum(p.nbytes for p in self.vectors)
        if not end:
            return rows.new_zeros((*rows.shape[:-1], 0), dtype=torch.float32)
        return rows[..., :end].view(torch.float32)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each key's shape (as the env gives it) and kind."""
        return {p.key: {"shape": list(p.source_shape), "kind": "image" if p.image else "vector"} for p in self.parts}

    def is_one(self, obs: dict[str, Any]) -> bool:
        """Whether `obs` is one observation rather than a batch, told by the shape of its first key present (of a
        vector key: its values, with no more dimensions than the env's shape has)."""
        part = next((p for p in self.parts if p.key in obs), self.parts[0])
        shape = np.shape(obs.get(part.key, ()))
        if part.image:
            return shape == part.source_shape
        return math.prod(shape) == part.size and len(shape) <= len(part.source_shape)


def _fits(shape: tuple[int, ...], n: int, part: Part) -> bool:
    """Whether values of `shape` are `n` of `part`'s: an image exactly; a vector key in its own shape or flattened,
    size-1 dimensions aside (a (1,) value given as a scalar; a transposed one does not fit)."""
    if not shape or shape[0] != n:
        return False
    if part.image:
        return shape[1:] == part.shape

    def squeezed(dims: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d for d in dims if d != 1)

    return squeezed(shape[1:]) in (squeezed(part.source_shape), squeezed(part.shape))
