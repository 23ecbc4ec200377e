"""Shared helpers for the device tests."""

from __future__ import annotations

from fedcure_app.devices import DeviceProfile


def _profile(**kw: object) -> DeviceProfile:
    base: dict[str, object] = dict(
        name="dev", f_min_ghz=0.5, f_max_ghz=2.0, cycles_per_sample={"mnist": 1e6},
        uplink_mbps=10.0, downlink_mbps=20.0, kappa=1e-9, jitter=0.0,
    )
    base.update(kw)
    return DeviceProfile.model_validate(base)
