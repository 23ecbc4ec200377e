"""``fedcure testbed``'s own options, without root: the device mix dealt to clients, the
``--client-cores`` share, and the testbed's defaults, which a ``--config`` file or an option
overrides."""

from __future__ import annotations

import pytest

from fedcure_app.cli import build_parser
from fedcure_app.cli.errors import UsageError
from fedcure_app.cli.testbed import (
    TESTBED_DEFAULTS,
    TESTBED_MESSAGING,
    apply_testbed_defaults,
    client_cores_option,
    client_profiles,
    messaging_defaults,
    parse_mix,
)
from fedcure_app.config import FedCureConfig, apply_flat


def test_mix_entries_are_dealt_to_clients_in_id_order_with_repeats():
    assert parse_mix("rpi4,rpi5*2, laptop") == ["rpi4", "rpi5", "rpi5", "laptop"]
    cfg = apply_flat(FedCureConfig(), {"num-clients": 9, "num-edges": 3})
    names = [p.name for p in client_profiles(cfg, parse_mix("rpi4,rpi5*4"), None)]
    assert names == ["rpi4", "rpi5", "rpi5", "rpi5", "rpi5", "rpi4", "rpi5", "rpi5", "rpi5"]


@pytest.mark.parametrize("text, word", [("rpi4,toaster", "toaster"), ("rpi4*0", "rpi4*0"),
                                        ("rpi4*x", "rpi4*x"), ("", "''")])
def test_a_bad_mix_is_a_usage_error_naming_the_entry(text, word):
    with pytest.raises(UsageError, match="--mix") as err:
        parse_mix(text)
    assert word in str(err.value)


@pytest.mark.parametrize("text, value", [("auto", None), ("AUTO", None), ("0.5", 0.5), ("1", 1.0)])
def test_client_cores_is_auto_or_a_share_of_one_core(text, value):
    assert client_cores_option(text) == value


@pytest.mark.parametrize("text", ["0", "-0.2", "1.5", "nan", "half"])
def test_client_cores_outside_0_1_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--client-cores"):
        client_cores_option(text)


def _args(*argv: str):
    return build_parser().parse_args(["testbed", "--out", "x", *argv])


def test_the_testbed_defaults_fill_what_nobody_set():
    args = _args()
    apply_testbed_defaults(args)
    assert {d: getattr(args, d) for d in TESTBED_DEFAULTS} == {
        d: v for d, (_, _, v) in TESTBED_DEFAULTS.items()}
    assert (args.clients, args.edges, args.client_cores) == (9, 3, "auto")


def test_an_option_or_the_config_file_beats_the_testbed_default(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[method]\ntau-c = 7\n")
    args = _args("--config", str(cfg), "--rounds", "5")
    apply_testbed_defaults(args)
    assert args.rounds == 5  # the option
    assert args.tau_c is None  # the file's value stays in charge
    assert args.tau_e == TESTBED_DEFAULTS["tau_e"][2]


def test_the_testbed_puts_its_messaging_in_the_latency_prior_unless_the_file_sets_it(tmp_path):
    assert messaging_defaults(_args()) == {"edge-round-overhead-s": 1.55,
                                          "edge-round-client-samples": 177}
    cfg = apply_flat(FedCureConfig(), messaging_defaults(_args()))
    assert cfg.devices.edge_round_overhead_s == TESTBED_MESSAGING["edge_round_overhead_s"]
    path = tmp_path / "c.toml"
    path.write_text("[devices]\nedge-round-overhead-s = 0\n")
    assert messaging_defaults(_args("--config", str(path))) == {
        "edge-round-client-samples": 177}  # the paper's model alone, as the file asks
