"""Device profiles ↔ their protobuf message (``cloud.proto``'s ``DeviceProfile``), apart from the
other conversions (:mod:`fedcure_app.protocol.convert`, which re-exports these) because the client
role registers its profile and should load neither the array codec nor NumPy to do it. Units are
the profile's (GHz, cycles per sample, Mbit/s); an invalid message raises
:class:`~fedcure_app.protocol.errors.CodecError`."""

from __future__ import annotations

from typing import Any

from fedcure_app.devices import DeviceProfile, ProfileError, parse_profile
from fedcure_app.protocol import cloud_pb2 as pb
from fedcure_app.protocol.errors import CodecError


def profile_to_proto(profile: DeviceProfile) -> pb.DeviceProfile:
    """A :class:`DeviceProfile` as its proto message."""
    return pb.DeviceProfile(
        name=profile.name,
        f_min_ghz=profile.f_min_ghz,
        f_max_ghz=profile.f_max_ghz,
        cycles_per_sample=dict(profile.cycles_per_sample),
        uplink_mbps=profile.uplink_mbps,
        downlink_mbps=profile.downlink_mbps,
        kappa=profile.kappa,
        jitter=profile.jitter,
    )


def profile_from_proto(msg: pb.DeviceProfile) -> DeviceProfile:
    """The validated :class:`DeviceProfile` of a proto message (:class:`CodecError` if invalid)."""
    data: dict[str, Any] = {
        "name": msg.name,
        "f_min_ghz": msg.f_min_ghz,
        "f_max_ghz": msg.f_max_ghz,
        "cycles_per_sample": dict(msg.cycles_per_sample),
        "uplink_mbps": msg.uplink_mbps,
        "downlink_mbps": msg.downlink_mbps,
        "kappa": msg.kappa,
    }
    if msg.HasField("jitter"):
        data["jitter"] = msg.jitter
    try:
        return parse_profile(data)
    except ProfileError as err:
        raise CodecError(f"invalid device profile: {err}") from None


__all__ = ["profile_from_proto", "profile_to_proto"]
