"""Hostile (or broken) inputs at a client and at the cloud (docs/security.md, "What the cloud
learns" and "Bounded resources"): nothing private leaves a device in a withdraw reason, no link
leads a client out of its PATH, and one file, task or request cannot make a role allocate
without bound, crash with a traceback or train to NaN.

The memory cases are header-only files: an ``.npz`` member or a PNG whose header declares a
huge array or image and whose data is missing. A reader that loaded or decoded it would fail
with a read error (or allocate gigabytes); the refusals below name the size, so they were
decided from the header alone.
"""

from __future__ import annotations

import json
import logging
import math
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.own_data import tag_refusal, untag_refusal
from cloud_server import validation as door
from fedcure_app.config import MIN_HISTOGRAM_EPSILON, ConfigError, build_config
from fedcure_app.core.privacy import private_histogram
from fedcure_app.data.errors import ClientDataError
from fedcure_app.data.own import infer_task, normalise_x, read_client_data
from fedcure_app.data.own_images import MAX_IMAGE_PIXELS
from fedcure_app.data.own_tables import MAX_NPZ_ARRAY_BYTES, read_npz
from fedcure_app.data.task import MAX_INPUT_VALUES, TaskFileError, parse_task
from fedcure_app.models import MAX_MODEL_PARAMETERS, ModelImportError, check_task_model
from fedcure_app.protocol.withdraw import (
    WITHDRAW_CODES,
    known_reason,
    reason_text,
    withdraw_reason,
)
from tests.data.own_builders import image_task, table_task, write_classes, write_csv

PRIVATE = "Jane Doe DOB 1970-01-01"


def reason_of(call) -> str:
    with pytest.raises(ClientDataError) as info:
        call()
    assert "\n" not in str(info.value)
    return withdraw_reason(info.value)


# ---------------------------------------------------------------- what the cloud learns
def test_a_refused_image_is_withdrawn_as_a_code_and_a_count_never_its_file_name(tmp_path):
    write_classes(tmp_path / "c", {"cat": 20}, hw=(9, 9))
    (tmp_path / "c" / "cat" / "000.png").rename(tmp_path / "c" / "cat" / f"0 {PRIVATE}.png")
    with pytest.raises(ClientDataError) as info:
        read_client_data(tmp_path / "c", image_task())
    assert PRIVATE in str(info.value)  # the client's own line names the file
    assert withdraw_reason(info.value) == "shape-mismatch: 20 files"


def test_an_unknown_class_is_withdrawn_as_unknown_class_with_its_count(tmp_path):
    write_classes(tmp_path / "c", {"cat": 2, PRIVATE: 2})
    assert reason_of(lambda: read_client_data(tmp_path / "c", image_task())) == \
        "unknown-class: 1 class"


def test_a_csv_linked_to_a_file_outside_path_is_refused_and_its_content_never_sent(tmp_path):
    secret = tmp_path / "elsewhere" / "passwd.csv"
    write_csv(secret, ["f0", "label"], [["root:x:0:0", "a"]])
    client = tmp_path / "client"
    client.mkdir()
    (client / "data.csv").symlink_to(secret)
    with pytest.raises(ClientDataError) as info:
        read_client_data(client, table_task(features=1))
    line, reason = str(info.value), withdraw_reason(info.value)
    assert "symbolic link out of" in line and "root:x" not in line
    assert reason == "symlink-outside: 1 link"


def test_a_link_to_another_clients_folder_is_refused_a_link_inside_path_is_read(tmp_path):
    write_classes(tmp_path / "other", {"dog": 3})
    write_classes(tmp_path / "mine", {"cat": 3})
    (tmp_path / "mine" / "dog").symlink_to(tmp_path / "other" / "dog")
    assert reason_of(lambda: read_client_data(tmp_path / "mine", image_task())) == \
        "symlink-outside: 1 link"
    (tmp_path / "mine" / "dog").unlink()
    (tmp_path / "mine" / "cat" / "again.png").symlink_to(tmp_path / "mine" / "cat" / "000.png")
    assert read_client_data(tmp_path / "mine", image_task(), holdout=0).train_size == 4


def test_the_childs_refusal_line_carries_the_code_and_the_count_to_the_role():
    err = ClientDataError(f"/home/{PRIVATE}/x.npz: x holds 3 bad values", "not-finite", 3)
    back = untag_refusal(tag_refusal(err))
    assert str(back) == str(err)
    assert withdraw_reason(back) == "not-finite: 3 values"
    assert withdraw_reason(untag_refusal(f"{PRIVATE}: untagged")) == "data-refused"


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=80), st.sampled_from(sorted(WITHDRAW_CODES)),
       st.one_of(st.none(), st.integers(min_value=0, max_value=10**9)))
def test_a_withdraw_reason_is_a_known_code_and_never_holds_the_refusals_line(line, code, count):
    reason = withdraw_reason(ClientDataError(f"/data/{line}", code, count))
    assert known_reason(reason) == reason == reason_text(code, count)
    assert f"/data/{line}" not in reason
    assert reason.split(":")[0] == code


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=120))
def test_the_cloud_keeps_a_free_text_reason_only_as_unrecognised(text):
    kept = known_reason(text)
    assert kept == "unrecognised" or kept == text and kept.split(":")[0] in WITHDRAW_CODES


def test_a_mismatch_with_the_cloud_and_a_model_that_does_not_build_have_codes_of_their_own():
    from fedcure_app.errors import UsageError

    assert withdraw_reason(UsageError(f"--data /home/{PRIVATE}: ...")) == "task-mismatch"
    assert withdraw_reason(ModelImportError(f"model {PRIVATE}:f ...")) == "model-refused"
    assert withdraw_reason(ConfigError(f"{PRIVATE}")) == "task-refused"


def test_the_cloud_logs_a_withdraw_with_a_file_name_as_unrecognised(caplog):
    from tests.deployment.fakes import channel, make_cfg, start_cloud
    from fedcure_app.protocol import cloud_pb2 as pb
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc

    server = start_cloud(make_cfg(3, 1), expected=3)
    ch = channel(server.address)
    try:
        stub = pb_grpc.AssociationStub(ch)
        stub.Claim(pb.ClaimRequest(client_name="c0"), timeout=5.0)
        with caplog.at_level(logging.WARNING, logger="fedcure.cloud"):
            stub.Withdraw(pb.WithdrawRequest(client_name="c0", reason=f"{PRIVATE}.png: bad"),
                          timeout=5.0)
        assert server.service.controller.roster.withdrawn == {"c0": "unrecognised"}
        assert not any(PRIVATE in r.getMessage() for r in caplog.records)
    finally:
        ch.close()
        server.stop()


# ---------------------------------------------------------------- .npz: headers first
def _npy_header(shape: tuple[int, ...], dtype: str) -> bytes:
    head = repr({"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    head = head.encode("latin1")
    pad = 64 - (10 + len(head) + 1) % 64
    head += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head


def write_npz(path: Path, arrays: dict[str, np.ndarray],
              claimed: dict[str, tuple[tuple[int, ...], str]] | None = None) -> Path:
    """An .npz of ``arrays`` plus, for each of ``claimed``, a member holding only a header
    that declares that shape and dtype (no data)."""
    with zipfile.ZipFile(path, "w") as zf:
        for key, arr in arrays.items():
            with zf.open(f"{key}.npy", "w") as f:
                np.lib.format.write_array(f, np.asarray(arr), allow_pickle=False)
        for key, (shape, dtype) in (claimed or {}).items():
            zf.writestr(f"{key}.npy", _npy_header(shape, dtype))
    return path


def test_an_unused_2_gib_npz_member_is_never_loaded(tmp_path):
    x = np.zeros((4, 3), np.float32)
    path = write_npz(tmp_path / "c.npz", {"x": x, "y": np.array(["a", "b", "a", "b"])},
                     {"junk": ((2**28,), "<f8")})
    parts = read_npz(path, ["a", "b"])
    assert parts["train"][0].shape == (4, 3)


def test_an_x_over_the_documented_size_is_refused_from_its_header(tmp_path):
    rows = MAX_NPZ_ARRAY_BYTES // 4 // 1000 + 1
    path = write_npz(tmp_path / "c.npz", {"y": np.zeros(rows, np.int64)},
                     {"x": ((rows, 1000), "<f4")})
    with pytest.raises(ClientDataError, match="GiB a client loads per array") as info:
        read_npz(path)
    assert withdraw_reason(info.value) == "too-large: 1 file"


def test_ten_million_labels_for_one_row_are_refused_before_any_label_is_read(tmp_path):
    path = write_npz(tmp_path / "c.npz", {"x": np.zeros((1, 3), np.float32)},
                     {"y": ((10**7,), "<i8")})
    with pytest.raises(ClientDataError, match="x has 1 samples, y has 10000000 labels"):
        read_npz(path)


def test_a_member_of_python_objects_is_refused_from_its_header(tmp_path):
    path = write_npz(tmp_path / "c.npz", {"x": np.zeros((2, 3), np.float32)},
                     {"y": ((2,), "|O")})
    assert reason_of(lambda: read_npz(path)) == "bad-format"


# ---------------------------------------------------------------- non-finite after the cast
def test_a_csv_cell_of_1e39_is_refused_at_read_time_it_is_inf_in_float32(tmp_path):
    write_csv(tmp_path / "c.csv", ["f0", "label"], [["1.0", "a"], ["1e39", "b"]])
    assert reason_of(lambda: read_client_data(tmp_path / "c.csv", table_task(features=1))) \
        == "not-finite: 1 value"


def test_npz_features_of_1e39_are_refused_after_the_float32_cast(tmp_path):
    x = np.array([[1.0, 1e39], [-1e39, 2.0]], np.float64)
    np.savez(tmp_path / "c.npz", x=x, y=np.array(["a", "b"]))
    assert reason_of(lambda: read_client_data(tmp_path / "c.npz", table_task(features=2))) \
        == "not-finite: 2 values"


# ---------------------------------------------------------------- the task's bounds
@pytest.mark.parametrize("shape, resize", [([1, 65536, 65536], False), ([1, 4096, 4096], True)])
def test_a_task_input_beyond_the_bound_is_refused_in_one_line(shape, resize):
    with pytest.raises(TaskFileError, match=f"at most {MAX_INPUT_VALUES:,}") as info:
        parse_task({"classes": ["a", "b"], "input-shape": shape, "resize": resize})
    assert "\n" not in str(info.value)


def test_a_model_over_the_parameter_bound_is_refused_without_allocating_it():
    task = parse_task({"classes": [str(i) for i in range(100)], "input-shape": [3, 1024, 1024]})
    with pytest.raises(ModelImportError, match=f"at most {MAX_MODEL_PARAMETERS:,}"):
        check_task_model(task)  # 209 M parameters (840 MB) on the meta device: none allocated
    assert check_task_model(image_task()) > 0


@pytest.mark.parametrize("model, words", [("no_such_module_61:factory", "cannot import"),
                                          ("json:loads", "raised TypeError"),
                                          ("builtins:slice", "not a torch.nn.Module")])
def test_a_task_whose_model_cannot_be_built_is_refused_in_one_line(model, words):
    task = parse_task({"classes": ["a", "b"], "kind": "tabular", "features": 3, "model": model})
    with pytest.raises(ModelImportError, match=words) as info:
        check_task_model(task)  # what fedcure-cloud --task runs at start
    assert "\n" not in str(info.value)


def test_the_cloud_refuses_a_task_whose_model_is_too_large_at_start_in_one_line(tmp_path):
    classes = json.dumps([str(i) for i in range(100)])
    task = tmp_path / "task.toml"
    task.write_text(f"[task]\nclasses = {classes}\ninput-shape = [3, 1024, 1024]\n")
    done = subprocess.run([sys.executable, "-m", "cloud_server", "--task", str(task),
                           "--listen", "127.0.0.1:0", "--expected-clients", "2", "--edges", "1",
                           "--insecure"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "FLWR_TELEMETRY_ENABLED": "0"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "parameters, at most" in lines[0], done.stderr


def test_a_client_refuses_a_huge_task_in_one_line_before_reading_any_data(tmp_path):
    from fedcure_app.flower.own_node import own_node_data

    huge = {"classes": ["a", "b"], "input-shape": [1, 65536, 65536]}
    with pytest.raises(ConfigError) as info:  # what the role's config_of raises at Claim
        build_config({"task": huge})
    assert "\n" not in str(info.value) and "at most 3,145,728" in str(info.value)
    wide = {"classes": [str(i) for i in range(100)], "input-shape": [3, 1024, 1024]}
    cfg = build_config({"task": wide, "federation": {"num-classes": 100}})
    missing = tmp_path / "never-read"
    with pytest.raises(ModelImportError, match="parameters, at most"):
        own_node_data(cfg, missing, index=0, name="c0")  # the model first: PATH is not read
    assert withdraw_reason(ModelImportError("x")) == "model-refused"


@pytest.mark.parametrize("mean, std", [(0.5, 1e-40), (1e308, 1.0), (0.0, 1e39)])
def test_a_task_whose_normalised_range_is_not_float32_is_refused(mean, std):
    with pytest.raises(TaskFileError, match="not representable in float32"):
        parse_task({"classes": ["a", "b"], "input-shape": [1, 2, 2], "mean": [mean],
                    "std": [std]})


@settings(max_examples=150, deadline=None)
@given(st.floats(-1e30, 1e30), st.floats(1e-30, 1e30))
def test_an_accepted_task_normalises_any_pixel_to_a_finite_float32(mean, std):
    try:
        task = parse_task({"classes": ["a", "b"], "input-shape": [1, 1, 2], "mean": [mean],
                           "std": [std]})
    except TaskFileError:
        return
    x = np.array([[[[0, 255]]]], np.uint8)
    assert np.isfinite(normalise_x(x, task)).all()


def test_a_duplicate_among_100_000_classes_is_found_in_one_pass():
    classes = [f"c{i}" for i in range(99_999)] + ["c99998"]
    with pytest.raises(TaskFileError, match="'c99998' is listed twice"):
        parse_task({"kind": "tabular", "features": 2, "classes": classes})


# ---------------------------------------------------------------- images: headers first
def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def _png_header_only(path: Path, width: int, height: int, colour: int = 0) -> Path:
    """A PNG whose header declares ``width``×``height`` and whose pixel data is one row:
    Pillow reads the size from the header; decoding it would fail (truncated)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr)
                     + _chunk(b"IDAT", zlib.compress(b"\x00" * (width + 1)))
                     + _chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("resize", [False, True])
def test_a_12000_square_png_is_refused_from_its_header_never_decoded(tmp_path, resize):
    assert 12_000 ** 2 > MAX_IMAGE_PIXELS
    write_classes(tmp_path / "c", {"cat": 2})
    _png_header_only(tmp_path / "c" / "cat" / "big.png", 12_000, 12_000)
    with pytest.raises(ClientDataError, match="12000×12000, more than the") as info:
        read_client_data(tmp_path / "c", image_task(resize=resize))
    assert withdraw_reason(info.value) == "too-large: 1 file"


# ---------------------------------------------------------------- channels (issue 62)
def test_rgb_images_under_a_greyscale_task_are_refused_like_a_size_mismatch(tmp_path):
    write_classes(tmp_path / "c", {"cat": 3}, channels=3)
    with pytest.raises(ClientDataError, match=r"3 channels \(mode RGB\).*convert = true"):
        read_client_data(tmp_path / "c", image_task())
    assert reason_of(lambda: read_client_data(tmp_path / "c", image_task())) == \
        "channel-mismatch: 3 files"


def test_with_convert_the_converted_images_are_logged_once_with_their_count(tmp_path, caplog):
    write_classes(tmp_path / "c", {"cat": 3, "dog": 2}, channels=3)
    with caplog.at_level(logging.INFO, logger="fedcure_app.data.own_images"):
        data = read_client_data(tmp_path / "c", image_task(convert=True), holdout=0)
    assert data.x_train.shape == (5, 1, 6, 5)
    lines = [r.getMessage() for r in caplog.records if "converted" in r.getMessage()]
    assert len(lines) == 1 and "5 images converted to 1 channel" in lines[0]


def test_an_npz_of_other_channels_is_refused_unless_convert(tmp_path):
    x = np.zeros((4, 6, 5, 3), np.uint8)
    np.savez(tmp_path / "c.npz", x=x, y=np.array(["cat", "dog", "cat", "dog"]))
    assert reason_of(lambda: read_client_data(tmp_path / "c.npz", image_task())) == \
        "channel-mismatch: 4 files"
    data = read_client_data(tmp_path / "c.npz", image_task(convert=True), holdout=0)
    assert data.x_train.shape == (4, 1, 6, 5)


def test_task_init_takes_the_majority_mode_and_names_the_clients_in_the_minority(tmp_path):
    for name in ("c0", "c1", "c2"):
        write_classes(tmp_path / name, {"cat": 3, "dog": 3})
    write_classes(tmp_path / "c3", {"cat": 2, "dog": 2}, channels=3)
    task, summary = infer_task(tmp_path)
    assert task.input_shape == [1, 6, 5]
    [note] = summary["notes"]
    assert "c3" in note and "c0" not in note and "convert = true" in note


# ---------------------------------------------------------------- registration
def test_a_signature_that_overflows_or_recurses_is_refused_in_one_line():
    for text in ('[["a", [1e999]]]', "[" * 100_000 + "]" * 100_000, '[["a", [-1]]]', "{}"):
        with pytest.raises(door.Refused) as info:
            door.parse_signature(text)
        assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_register_with_a_hostile_signature_answers_invalid_argument():
    from tests.deployment.fakes import channel, make_cfg, register_request, start_cloud
    from fedcure_app.protocol import cloud_pb2_grpc as pb_grpc

    cfg = build_config({**make_cfg(2, 1).model_dump(),
                        "task": table_task(classes=("a", "b", "c", "d")).model_dump()})
    server = start_cloud(cfg, expected=2)
    ch = channel(server.address)
    try:
        stub = pb_grpc.AssociationStub(ch)
        for text in ('[["a", [1e999]]]', "[" * 100_000 + "]" * 100_000):
            req = register_request("c0", [1, 1, 1, 1])
            req.model_signature = text
            with pytest.raises(grpc.RpcError) as info:
                stub.Register(req, timeout=10.0)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "\n" not in info.value.details()
            assert "model_signature is not" in info.value.details()
    finally:
        ch.close()
        server.stop()


def test_an_epsilon_below_the_documented_bound_is_refused_everywhere():
    with pytest.raises(door.Refused, match="0.001"):
        door.check_epsilon(1e-9)
    with pytest.raises(ConfigError, match="histogram-epsilon.*0.001"):
        build_config({"data": {"histogram-epsilon": 1e-9}})
    door.check_epsilon(0.0)
    door.check_epsilon(MIN_HISTOGRAM_EPSILON)


@settings(max_examples=100, deadline=None)
@given(st.floats(MIN_HISTOGRAM_EPSILON, 1e3),
       st.lists(st.integers(0, 10**6), min_size=2, max_size=10))
def test_at_the_epsilon_bound_a_noisy_histogram_stays_within_the_clouds_bounds(eps, counts):
    noisy = private_histogram(np.asarray(counts), eps, rng=np.random.default_rng(0))
    door.check_label_counts(noisy.tolist(), len(counts), allow_zero=True)
    assert math.isfinite(float(noisy.sum()))


def test_a_data_path_node_answers_its_refusal_as_a_code_and_logs_the_line(tmp_path, caplog,
                                                                         monkeypatch):
    """Under ``flwr run`` a node's refusal travels to the ServerApp as the ClientApp's error:
    a code and a count there, the line in the node's own log."""
    from flwr.app import Context, RecordDict

    from fedcure_app.flower import app_config, client_app

    write_csv(tmp_path / f"{PRIVATE}.csv", ["f0", "label"], [["1e39", "a"], ["1", "b"]])
    cfg = build_config({"task": table_task(features=1).model_dump(),
                        "federation": {"num-clients": 2, "num-edges": 1, "num-classes": 3}})
    monkeypatch.setattr(app_config, "config_from_run_config", lambda _rc: cfg)
    monkeypatch.setenv("FEDCURE_CACHE_DIR", str(tmp_path / "cache"))
    ctx = Context(run_id=1, node_id=7, state=RecordDict(), run_config={},
                  node_config={"data-path": str(tmp_path / f"{PRIVATE}.csv"), "partition-id": 0})
    with caplog.at_level(logging.ERROR, logger="fedcure_app.flower.client_app"):
        with pytest.raises(ValueError) as info:
            client_app.deployed_state(ctx)
    assert str(info.value) == "data-path refused: not-finite: 1 value"
    assert any(PRIVATE in r.getMessage() for r in caplog.records)
