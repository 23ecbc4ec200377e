"""``fedcure testbed`` for real (root): a short run in namespaces, what it leaves in --out, and
that nothing of it is left on the machine afterwards, also after Ctrl-C; without root it exits
2 with one line before making anything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedcure_app.cli import main
from fedcure_app.testbed import netns
from tests.interrupts import end_process
from tests.kernel import require_cgroup, require_netns

_ARGS = ["--dataset", "digits", "--edges", "2", "--clients", "4", "--tau-e", "2",
         "--no-progress", "--register-timeout", "120"]


def _leftovers(prefix_base: str, out: Path) -> list[str]:
    """Namespaces, cgroups and processes of ours still on the machine."""
    from fedcure_app.devices.cgroup import find_cpu_controller

    found = [n for n in netns.list_namespaces() if n.startswith(prefix_base)]
    found += [str(d) for d in find_cpu_controller().base.glob(f"{prefix_base}*")]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(out) in cmd or f"{prefix_base}" in cmd and "nsenter" in cmd:
                found.append(f"pid {pid}: {cmd[:120]}")
    return found


def _testbed(out: Path, base: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "fedcure_app.cli", "testbed", "--out",
                             str(out), "--prefix", base, *_ARGS, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _watch_live_view(proc: subprocess.Popen, lines: list[str], seen: dict) -> None:
    """Read the testbed's output; once it prints the live view's address, read the page and
    its state from this host while the run goes on, until the clients show their devices."""
    import urllib.request

    for line in proc.stdout:
        lines.append(line)
        if "live view: http://" in line and "url" not in seen:
            seen["url"] = line.split("live view: ", 1)[1].split(";")[0].strip()
            end = time.monotonic() + 240
            while time.monotonic() < end and proc.poll() is None:
                try:
                    with urllib.request.urlopen(seen["url"], timeout=5) as r:
                        seen["page"] = r.read().decode()
                    with urllib.request.urlopen(seen["url"] + "api/state", timeout=5) as r:
                        state = json.loads(r.read())
                    seen["metrics"] = urllib.request.urlopen(seen["url"] + "metrics",
                                                             timeout=5).read().decode()
                except OSError:
                    time.sleep(0.5)
                    continue
                if state["clients"] and all(c["device"] for c in state["clients"]):
                    seen["state"] = state
                    break
                time.sleep(0.5)


def test_a_short_testbed_runs_with_real_quotas_and_leaves_nothing(tmp_path):
    """Also: its live view answers on the address it prints, from this host, while it runs,
    shows each client's device and names the mode (testbed); the summary says what the run
    demonstrates."""
    require_netns()
    require_cgroup()
    out = tmp_path / "run"
    proc = _testbed(out, "tbrun", "--rounds", "3", "--timeout", "400", "--mix", "rpi4,rpi5")
    lines: list[str] = []
    seen: dict = {}
    try:
        _watch_live_view(proc, lines, seen)
        proc.wait(timeout=500)
    finally:
        end_process(proc)  # SIGTERM: it removes its namespaces and stops its roles
    text = "".join(lines)
    assert proc.returncode == 0, text[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["complete"] and result["rounds"] == 3
    profiles = json.loads((out / "profiles.json").read_text())
    assert [p["name"] for p in profiles] == ["rpi4", "rpi5"] * 2  # dealt by client id
    assert seen.get("url", "").startswith("http://127.0.0.1:"), text[-3000:]
    assert "static/app.js" in seen.get("page", ""), seen
    assert "fedcure_global_version" in seen.get("metrics", "")
    assert [c["device"] for c in seen["state"]["clients"]] == [p["name"] for p in profiles]
    # the page and /metrics call the run a testbed, not a deployment
    assert seen["state"]["mode"] == "testbed"
    assert 'mode="testbed"' in seen["metrics"]
    # every warning it printed is in result.json too
    details = [w["detail"] for w in result["warnings"]]
    for line in lines:
        if line.startswith("WARNING "):
            assert " ".join(line.split(": ", 1)[1].split()) in details, (line, details)
    record = json.loads((out / "testbed.json").read_text())
    assert record["host_samples_per_s"] > 0
    assert all(code == 0 for code in record["exit_codes"].values()), record["exit_codes"]
    clients = [n for n in record["nodes"] if n["role"].startswith("client")]
    assert [(n["up_mbps"], n["down_mbps"]) for n in clients] == [
        (p["uplink_mbps"], p["downlink_mbps"]) for p in profiles]
    assert "what this run demonstrates" in text and "latency spread" in text, text[-3000:]
    assert list(out.glob("*.png")), "the run's plots"
    # the run's model in its folder, and the summary's weakest and strongest digits by name
    assert all((out / f).is_file() for f in ("model.pt", "model.pt2", "task.toml"))
    assert list(result["class_accuracy_by_name"]) == [str(d) for d in range(10)]
    assert "weakest classes" in text and "strongest classes" in text, text[-3000:]
    applied = [json.loads(line) for f in out.glob("work/client*/*.applied.jsonl")
               for line in f.read_text().splitlines()]
    assert applied and {a["cpufreq"] for a in applied} == {"cgroup"}
    assert _leftovers("tbrun", out) == []


def test_ctrl_c_stops_the_testbed_and_removes_everything(tmp_path):
    require_netns()
    require_cgroup()
    out = tmp_path / "run"
    proc = _testbed(out, "tbint", "--rounds", "50", "--timeout", "300")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # interrupted while clients train
            logs = list(out.glob("work/client*/*.applied.jsonl"))
            if logs:
                break
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.5)
        assert [n for n in netns.list_namespaces() if n.startswith("tbint")]
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        end_process(proc)  # SIGTERM: it removes its namespaces and stops its roles
    assert proc.returncode == 130, text[-3000:]
    assert _leftovers("tbint", out) == []


def test_without_root_it_exits_2_in_one_line_and_makes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    before = netns.list_namespaces() if os.path.exists("/run/netns") else []
    out = tmp_path / "never"
    assert main(["testbed", "--out", str(out), "--prefix", "tbroot", *_ARGS]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "root" in err[0] and err[0].startswith("fedcure testbed: error:")
    assert not out.exists()
    if before or os.path.exists("/run/netns"):
        assert netns.list_namespaces() == before


@pytest.mark.parametrize("bad, word", [(["--mix", "rpi4,toaster"], "--mix"),
                                       (["--prefix", "Bad-Prefix"], "--prefix"),
                                       (["--host-samples-per-s", "-1"], "--host-samples")])
def test_bad_testbed_options_are_one_line_errors(tmp_path, capsys, bad, word):
    assert main(["testbed", "--out", str(tmp_path / "x"), *_ARGS, *bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]
