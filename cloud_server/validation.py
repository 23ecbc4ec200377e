"""Validation at the door: every field a client or an edge server sends, checked before use.

Each check raises :class:`Refused` (an INVALID_ARGUMENT refusal) with a one-line message that
names the field and echoes at most :data:`ECHO` characters of what was sent (:func:`clip`). The
bounds describe real devices and real coalitions, with a wide margin:

=========================  =======================  ==============================================
field                      accepted                 why
=========================  =======================  ==============================================
client_name                1..128 characters, the   a host or device name (refused in one line
                           name rule                naming the rule)
label_counts               C entries in [0, 10⁹],   no client holds a billion samples of a class;
                           positive sum             the sum then fits int64 (no wrap-around)
f_min_ghz, f_max_ghz       [0.01, 10] GHz           microcontrollers to desktop CPUs
cycles_per_sample          [1, 10¹²] cycles         10¹² = 1000 s per sample at 1 GHz
uplink/downlink_mbps       [10⁻³, 10⁶] Mbit/s       1 kbit/s to 1 Tbit/s
kappa                      [10⁻³⁰, 10⁻³] J/(cycle·GHz²)  energy κ·c·f² stays finite for any
                                                    accepted c and f
profile name               1..64 printable
                           characters
supernode_public_key       at most 4096 characters  an OpenSSH EC public key is ~200
model_signature            JSON [[name, [dims]]],   a model's state_dict; any parse error
                           at most 10⁶ characters,  (OverflowError, RecursionError too) is
                           dims in [0, 2³¹)         INVALID_ARGUMENT in one line
histogram_epsilon          0, or [10⁻³, ∞)          Laplace noise of scale at most 1000
                                                    samples per class
compute_device             "", "cpu" or "cuda"      where the client trains ("": cpu)
samples_per_s              0 or [10⁻³, 10⁹]         0: not measured
task_id                    at most 128 characters   the cloud's ids are ``r<round>-c<m>-v<v>``
num_samples                [1, 10¹²]; at            a client cannot claim more samples than its
                           registration the label   histogram holds (its FedAvg weight and its
                           histogram's sum, within  coalition's data share come from this count)
                           its noise (ε) and the
                           classes its min count
                           zeroes
latency_s                  [0, 10⁷] s               ~116 days
dropped_client_ids         unique coalition members
stats                      at most one per (member, edge round < τ_e): no duplicate stats
stat.seconds               [0, 10⁷] s
stat.f_applied_ghz         [0, 100] GHz
stat.samples               [0, 10⁹]
stat.loss                  finite
edge address               1..256 printable         host:port
                           characters
=========================  =======================  ==============================================

The name rule (:func:`fedcure_app.protocol.text.name_problem`): every character printable (no
control, format or bidi character: no CR/LF, ESC, NUL, BEL, DEL or U+202E) and one path
component (no '/' or backslash, not '.' or '..').

Pure functions: the service calls them before touching any state.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from fedcure_app.config import MIN_HISTOGRAM_EPSILON
from fedcure_app.protocol.text import ECHO, clip, name_problem

MAX_NAME = 128
MAX_PROFILE_NAME = 64
MAX_KEY_CHARS = 4096
MAX_TASK_ID = 128
MAX_ADDRESS = 256
MAX_CLASS_SAMPLES = 10**9
GHZ_RANGE = (0.01, 10.0)
CYCLES_RANGE = (1.0, 1e12)
MBPS_RANGE = (1e-3, 1e6)
KAPPA_RANGE = (1e-30, 1e-3)
MAX_NUM_SAMPLES = 10**12
MAX_SECONDS = 1e7
MAX_APPLIED_GHZ = 100.0
MAX_STAT_SAMPLES = 10**9
MAX_SIGNATURE_CHARS = 1_000_000
MAX_DIM = 2**31


class Refused(ValueError):
    """A request field outside its bounds (INVALID_ARGUMENT, one line naming the field)."""


def _in(field: str, value: float, low: float, high: float, unit: str = "") -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
        raise Refused(f"{field} must be finite and in [{low:g}, {high:g}]{unit}, got "
                      f"{clip(value)}")


def check_name(name: str, field: str = "client_name") -> str:
    """A stripped, non-empty name of at most :data:`MAX_NAME` characters that passes the name
    rule (:func:`~fedcure_app.protocol.text.name_problem`)."""
    if len(name) > MAX_NAME:
        raise Refused(f"{field} has {len(name)} characters, at most {MAX_NAME}: {clip(name)}")
    why = name_problem(name)
    if why is not None:
        raise Refused(f"{field} {why}: {clip(name)}")
    name = name.strip()
    if not name:
        raise Refused(f"{field} is empty")
    return name


def check_label_counts(counts: Sequence[int], classes: int, *, allow_zero: bool = False
                       ) -> None:
    """C entries, each in [0, 10⁹], with a positive sum (which then fits int64); a private
    (noisy) histogram may sum to 0 (``allow_zero``: its sample count is sent apart)."""
    if len(counts) != classes:
        raise Refused(f"label_counts has {len(counts)} entries, expected {classes} classes")
    if any(not 0 <= int(c) <= MAX_CLASS_SAMPLES for c in counts):
        raise Refused(f"label_counts entries must be in [0, {MAX_CLASS_SAMPLES:g}] samples")
    if sum(int(c) for c in counts) <= 0 and not allow_zero:
        raise Refused("label_counts must have a positive sum")


def check_samples(num_samples: int) -> None:
    """A reported sample count in [0, 10⁹ · 10⁴] (0: not reported)."""
    if not 0 <= int(num_samples) <= MAX_CLASS_SAMPLES * 10_000:
        raise Refused(f"num_samples must be in [0, {MAX_CLASS_SAMPLES * 10_000:g}], got "
                      f"{clip(num_samples)}")


#: a class count's noise exceeds (ln C + SAMPLE_NOISE_NATS)/ε with probability at most
#: e^-SAMPLE_NOISE_NATS / C (Laplace, scale 1/ε): all C counts stay within it but once in 10¹³
SAMPLE_NOISE_NATS = 30.0
#: the largest histogram_min_count a client may report
MAX_MIN_COUNT = 1_000_000


def sample_count_slack(classes: int, epsilon: float, min_count: int) -> tuple[float, float]:
    """How far below and above the label histogram's sum an honest ``num_samples`` can lie:
    below by the Laplace noise (ε > 0: C·(0.5 + (ln C + 30)/ε), rounding included); above by
    that noise plus C·(K − 1) samples of the classes ``min_count`` K reports as 0."""
    noise = 0.0
    if epsilon > 0:
        noise = classes * (0.5 + (math.log(max(classes, 1)) + SAMPLE_NOISE_NATS) / epsilon)
    return noise, noise + classes * max(int(min_count) - 1, 0)


def check_sample_count(num_samples: int, counts: Sequence[int], epsilon: float,
                       min_count: int) -> None:
    """A registered ``num_samples`` equal to the label histogram's sum (0: the sum is the
    count), or, for a private histogram (``epsilon`` > 0, ``min_count`` > 0), within what its
    noise and its zeroed rare classes explain (:func:`sample_count_slack`): a client cannot
    claim more samples than the histogram it reports."""
    if not 0 <= int(min_count) <= MAX_MIN_COUNT:
        raise Refused(f"histogram_min_count must be in [0, {MAX_MIN_COUNT}], got "
                      f"{clip(min_count)}")
    if int(num_samples) == 0:
        return
    total = sum(int(c) for c in counts)
    below, above = sample_count_slack(len(counts), epsilon, min_count)
    if not total - below <= int(num_samples) <= total + above:
        raise Refused(f"num_samples {int(num_samples)} is not the label histogram's sum "
                      f"{total}" + (f" (within {below:.0f} below, {above:.0f} above for its "
                                     f"noise and min count)" if above else ""))


def check_epsilon(epsilon: float) -> None:
    """A histogram ε that is 0 (exact counts) or finite and ≥ :data:`MIN_HISTOGRAM_EPSILON`."""
    if not (epsilon == 0 or (math.isfinite(epsilon) and epsilon >= MIN_HISTOGRAM_EPSILON)):
        raise Refused(f"histogram_epsilon must be 0 (exact counts) or finite and >= "
                      f"{MIN_HISTOGRAM_EPSILON:g}, got {clip(epsilon)}")


def parse_signature(text: str) -> list[list[Any]] | None:
    """A client's model signature, JSON ``[[name, [dim, …]], …]``, as ``[[str, [int, …]], …]``
    (None when empty). Refused in one line, whatever the parser raises (a ``1e999`` dim is an
    OverflowError, 100,000 nested brackets a RecursionError)."""
    if not text:
        return None
    if len(text) > MAX_SIGNATURE_CHARS:
        raise Refused(f"model_signature has {len(text)} characters, at most "
                      f"{MAX_SIGNATURE_CHARS}")
    try:
        raw = json.loads(text)
        if not isinstance(raw, list):
            raise ValueError("not a list")
        out = [[str(k), [int(d) for d in shape]] for k, shape in raw]
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
        raise Refused(f"model_signature is not [[name, [dims]], …] ({type(err).__name__}: "
                      f"{clip(' '.join(str(err).split()))})") from None
    if any(not 0 <= d < MAX_DIM for _, shape in out for d in shape):
        raise Refused(f"model_signature has a dimension outside [0, {MAX_DIM})")
    return out


def check_profile(profile: Any, model: str) -> None:
    """Device-profile fields within real-device bounds (see the module table); ``model`` is
    the dataset whose cycles per sample the cloud will use."""
    if len(profile.name) > MAX_PROFILE_NAME:
        raise Refused(f"device.name has {len(profile.name)} characters, at most "
                      f"{MAX_PROFILE_NAME}")
    if not profile.name.isprintable():
        raise Refused(f"device.name has a non-printable character: {clip(profile.name)}")
    _in("device.f_min_ghz", profile.f_min_ghz, *GHZ_RANGE, " GHz")
    _in("device.f_max_ghz", profile.f_max_ghz, *GHZ_RANGE, " GHz")
    if len(profile.cycles_per_sample) > 64:
        raise Refused(f"device.cycles_per_sample has {len(profile.cycles_per_sample)} "
                      "entries, at most 64")
    for key, cps in profile.cycles_per_sample.items():
        if len(key) > MAX_PROFILE_NAME:
            raise Refused(f"device.cycles_per_sample key {clip(key)} is too long")
        if not key.isprintable():
            raise Refused(f"device.cycles_per_sample key {clip(key)} has a non-printable "
                          "character")
        _in(f"device.cycles_per_sample[{clip(key, 20)}]", cps, *CYCLES_RANGE, " cycles")
    _in("device.uplink_mbps", profile.uplink_mbps, *MBPS_RANGE, " Mbit/s")
    _in("device.downlink_mbps", profile.downlink_mbps, *MBPS_RANGE, " Mbit/s")
    _in("device.kappa", profile.kappa, *KAPPA_RANGE, " J/(cycle·GHz²)")
    try:
        profile.cycles_for(model)
    except KeyError:
        raise Refused(f"device.cycles_per_sample has no entry for {clip(model)}") from None


COMPUTE_DEVICES = ("cpu", "cuda")
SAMPLES_PER_S_RANGE = (1e-3, 1e9)


def check_compute(device: str, samples_per_s: float) -> tuple[str, float]:
    """Register's ``compute_device`` ("" means cpu) and ``samples_per_s`` (0: not measured)
    within bounds; returns them as the cloud keeps them."""
    device = device or "cpu"
    if device not in COMPUTE_DEVICES:
        raise Refused(f"compute_device {clip(device)} is not one of "
                      f"{', '.join(COMPUTE_DEVICES)}")
    rate = float(samples_per_s)
    if rate != 0.0:
        _in("samples_per_s", rate, *SAMPLES_PER_S_RANGE, " samples/s")
    return device, rate


def measured_profile(profile: Any, model: str, samples_per_s: float) -> Any:
    """``profile`` with the cycles per sample of ``model`` set so that its compute time per
    sample at f_max is 1/``samples_per_s`` (c = f_max·10⁹/rate): the latency prior of a client
    that measured its rate (a GPU client) is then its measured speed, not its CPU profile's."""
    cycles = dict(profile.cycles_per_sample)
    cycles[model.lower()] = profile.f_max_ghz * 1e9 / samples_per_s
    return profile.model_copy(update={"cycles_per_sample": cycles})


def check_profile_size(entries: int) -> None:
    """At most 64 ``cycles_per_sample`` entries (checked before the profile is parsed)."""
    if entries > 64:
        raise Refused(f"device.cycles_per_sample has {entries} entries, at most 64")


def check_key_text(key: str) -> None:
    if len(key) > MAX_KEY_CHARS:
        raise Refused(f"supernode_public_key has {len(key)} characters, at most {MAX_KEY_CHARS}")


def check_address(address: str) -> str:
    """An edge's SuperLink fleet address: ``host:port``, at most 256 characters."""
    if len(address) > MAX_ADDRESS:
        raise Refused(f"address has {len(address)} characters, at most {MAX_ADDRESS}")
    if not address.isprintable():
        raise Refused(f"address has a non-printable character (addresses are printable "
                      f"text): {clip(address)}")
    address = address.strip()
    host, sep, port = address.rpartition(":")
    if not address:
        raise Refused("address is empty (the edge's SuperLink fleet address)")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise Refused(f"address must be host:port, got {clip(address)}")
    return address


def task_id_known(task_id: str) -> bool:
    """False when ``task_id`` is too long to be one of the cloud's ids (answer NOT_FOUND)."""
    return len(task_id) <= MAX_TASK_ID


def check_submit(num_samples: int, latency_s: float, stats: Iterable[Any],
                 dropped: Sequence[int], members: Iterable[int], tau_e: int,
                 startup_s: float = 0.0) -> None:
    """The scalar and repeated fields of a Submit for a task of coalition ``members``.

    ``stats`` are ``ClientStat`` messages: at most one per (member, edge round) with edge
    rounds in [0, τ_e); ``dropped`` are unique members; ``startup_s`` (the part of the edge's
    ``latency_s`` that was start-up) lies in [0, latency_s].
    """
    if not 1 <= num_samples <= MAX_NUM_SAMPLES:
        raise Refused(f"num_samples must be in [1, {MAX_NUM_SAMPLES:g}], got {num_samples}")
    _in("latency_s", latency_s, 0.0, MAX_SECONDS, " s")
    _in("startup_s", startup_s, 0.0, latency_s, " s (at most latency_s)")
    group = set(int(c) for c in members)
    limit = len(group)
    if len(dropped) > limit:
        raise Refused(f"dropped_client_ids has {len(dropped)} entries; the coalition has "
                      f"{limit} members")
    if len(set(dropped)) != len(dropped):
        raise Refused("dropped_client_ids repeats a client id")
    strangers = sorted(set(dropped) - group)
    if strangers:
        raise Refused(f"dropped_client_ids {clip(strangers[:5])} are not members of the "
                      "task's coalition")
    count = len(stats) if hasattr(stats, "__len__") else None  # before any copy
    if count is not None and count > limit * tau_e:
        raise Refused(f"stats has {count} entries; at most one per member and edge round "
                      f"({limit} × {tau_e})")
    stats = list(stats)
    if len(stats) > limit * tau_e:
        raise Refused(f"stats has {len(stats)} entries; at most one per member and edge round "
                      f"({limit} × {tau_e})")
    seen: set[tuple[int, int]] = set()
    for s in stats:
        c = int(s.client_id)
        if c not in group:
            raise Refused(f"stats: client {c} is not a member of the task's coalition")
        if not 0 <= s.edge_round < tau_e:
            raise Refused(f"stats: client {c} edge_round {s.edge_round} outside [0, {tau_e})")
        if (c, s.edge_round) in seen:
            raise Refused(f"stats: client {c} edge round {s.edge_round} reported twice")
        seen.add((c, s.edge_round))
        _in(f"stats: client {c} seconds", s.seconds, 0.0, MAX_SECONDS, " s")
        _in(f"stats: client {c} f_applied_ghz", s.f_applied_ghz, 0.0, MAX_APPLIED_GHZ, " GHz")
        _in(f"stats: client {c} samples", s.samples, 0, MAX_STAT_SAMPLES)
        if not math.isfinite(s.loss):
            raise Refused(f"stats: client {c} loss must be finite, got {s.loss}")


__all__ = ["ECHO", "MIN_HISTOGRAM_EPSILON", "Refused", "check_address", "check_epsilon",
           "check_key_text", "parse_signature",
           "check_label_counts", "check_sample_count", "check_samples", "sample_count_slack",
           "check_name", "check_profile", "check_submit", "clip", "task_id_known"]
