"""The protocol's one error type, in a module of its own so that the wire path and the device
profiles' conversions raise it without loading the array codec (and NumPy)."""

from __future__ import annotations


class CodecError(ValueError):
    """A model buffer or message that cannot be decoded, phrased as one actionable line."""


__all__ = ["CodecError"]
