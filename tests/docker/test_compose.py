"""``docker compose`` end to end: build the image, run a cloud, two edges and four clients.

Runs when ``FEDCURE_DOCKER_TESTS=1`` (``.ci/run`` sets it); a developer's plain ``pytest``
skips it, saying so in the summary. With the variable set nothing is skipped: no Docker CLI, no
Compose, or a daemon that cannot start is a failure that says why.

What it does, as a new user would, through ``docker/compose.yaml``:

1. Uses the running Docker daemon, or starts ``dockerd`` (as root) and stops it at the end.
2. Picks the base image: ``$FEDCURE_DOCKER_BASE_IMAGE``; else ``python:3.11-slim`` when present
   or pullable; else an offline Debian base from ``docker/make-base-image.sh`` (debootstrap).
3. Puts the local CPU torch wheel (pip's find-links) and pip's CA bundle in ``docker/local/``
   when this machine has them, so the build downloads no torch and trusts the same CA as pip.
4. ``compose build`` (timed; image size measured), then ``compose up --scale client=4``
   (timed), asserts every container exited 0 and the cloud's result.json, plots and final model
   in the mounted results folder; then the same with ``docker/with-tls.yaml`` (mutual TLS).
5. ``compose down -v`` (containers, networks, volumes) after each run; the image stays as the
   build cache.

Figures (build time, image size, compose wall time) are printed to the terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
LOCAL = DOCKER_DIR / "local"
IMAGE = os.environ.get("FEDCURE_DOCKER_IMAGE", "fedcure:test")
CLIENTS = 4
ROUNDS = int(os.environ.get("FEDCURE_DOCKER_ROUNDS", "6"))
TLS_ROUNDS = int(os.environ.get("FEDCURE_DOCKER_TLS_ROUNDS", "3"))
UP_TIMEOUT_S = float(os.environ.get("FEDCURE_DOCKER_UP_TIMEOUT", "900"))
ENABLED = os.environ.get("FEDCURE_DOCKER_TESTS", "") == "1"

pytestmark = pytest.mark.skipif(
    not ENABLED, reason="docker compose end-to-end test: set FEDCURE_DOCKER_TESTS=1 "
    "(.ci/run does) to build the image and run the compose file")


def _run(argv: list[str], *, timeout: float = 120, env: dict[str, str] | None = None,
         check: bool = True, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip().splitlines()
        pytest.fail(f"`{' '.join(argv)}` exited {proc.returncode}:\n" + "\n".join(out[-60:]),
                    pytrace=False)
    return proc


def _docker_ok() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Docker:
    """The daemon (started here if none runs), the compose command and the figures."""

    def __init__(self, tmp: Path, report: Any) -> None:
        self.tmp = tmp
        self.report = report
        self.dockerd: subprocess.Popen[bytes] | None = None
        self.compose: list[str] = []
        self.added: list[Path] = []
        self.base_image = ""
        self.torch_index = ""
        self.image_size = 0

    # ---------------------------------------------------------------- daemon, CLI, compose
    def start(self) -> None:
        if shutil.which("docker") is None:
            pytest.fail("FEDCURE_DOCKER_TESTS=1 but the docker CLI is not installed "
                        "(apt-get install docker.io docker-compose)", pytrace=False)
        if not _docker_ok():
            self._start_dockerd()
        if _run(["docker", "compose", "version"], check=False).returncode == 0:
            self.compose = ["docker", "compose"]
        elif shutil.which("docker-compose"):
            self.compose = ["docker-compose"]
        else:
            pytest.fail("neither `docker compose` (v2) nor `docker-compose` (v1) is installed",
                        pytrace=False)

    def _start_dockerd(self) -> None:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            pytest.fail("Docker daemon not reachable (`docker info` fails) and no dockerd "
                        "binary to start one", pytrace=False)
        if os.geteuid() != 0:
            pytest.fail("Docker daemon not reachable and starting dockerd needs root",
                        pytrace=False)
        log = self.tmp / "dockerd.log"
        with open(log, "wb") as f:
            self.dockerd = subprocess.Popen([dockerd], stdout=f, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        end = time.monotonic() + 90
        while time.monotonic() < end:
            if self.dockerd.poll() is not None:
                break
            if _docker_ok():
                self.report(f"started dockerd (pid {self.dockerd.pid})")
                return
            time.sleep(1)
        tail = log.read_text(errors="replace").strip().splitlines()[-20:]
        self.stop_dockerd()
        pytest.fail("could not start the Docker daemon:\n" + "\n".join(tail), pytrace=False)

    def stop_dockerd(self) -> None:
        if self.dockerd is None or self.dockerd.poll() is not None:
            return
        self.dockerd.send_signal(signal.SIGTERM)
        try:
            self.dockerd.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.dockerd.kill()
            self.dockerd.wait(timeout=30)
        self.report(f"stopped dockerd (pid {self.dockerd.pid})")

    # ---------------------------------------------------------------- build inputs
    def pick_base_image(self) -> None:
        want = os.environ.get("FEDCURE_DOCKER_BASE_IMAGE", "")
        if want:
            if _run(["docker", "image", "inspect", want], check=False).returncode != 0:
                pytest.fail(f"FEDCURE_DOCKER_BASE_IMAGE={want} is not a local image "
                            "(docker/make-base-image.sh builds one offline)", pytrace=False)
            self.base_image = want
            return
        slim = "python:3.11-slim"
        if _run(["docker", "image", "inspect", slim], check=False).returncode == 0:
            self.base_image = slim
            return
        try:
            pulled = _run(["docker", "pull", slim], check=False, timeout=300).returncode == 0
        except subprocess.TimeoutExpired:
            pulled = False
        if pulled:
            self.base_image = slim
            return
        self.report(f"{slim} cannot be pulled: building an offline Debian base "
                    "(docker/make-base-image.sh)")
        _run(["sh", str(DOCKER_DIR / "make-base-image.sh"), "fedcure-base:bookworm"],
             timeout=1200)
        self.base_image = "fedcure-base:bookworm"

    def stage_local_files(self) -> None:
        """This machine's CPU torch wheel and pip CA bundle into docker/local/ (if any)."""
        LOCAL.mkdir(exist_ok=True)
        import importlib.metadata as md

        version = md.version("torch").split("+")[0]
        pyver = "cp311"  # the image's Python (python:3.11-slim, or bookworm's 3.11)
        for d in _pip_setting("find-links").split():
            d = d.removeprefix("file://")
            for whl in sorted(Path(d).glob(f"torch-{version}+cpu-{pyver}-*.whl")
                              if Path(d).is_dir() else []):
                self._add(whl, LOCAL / whl.name)
        if any(LOCAL.glob("torch-*.whl")):
            # only torch's dependencies come from the index: PyPI has them all
            self.torch_index = os.environ.get("FEDCURE_DOCKER_TORCH_INDEX",
                                              "https://pypi.org/simple")
        cert = os.environ.get("PIP_CERT") or _pip_setting("cert")
        if cert and Path(cert).is_file():
            self._add(Path(cert), LOCAL / "pip-ca.crt")

    def _add(self, src: Path, dst: Path) -> None:
        if dst.exists():
            return
        shutil.copyfile(src, dst)
        self.added.append(dst)

    def cleanup_local_files(self) -> None:
        for p in self.added:
            p.unlink(missing_ok=True)

    # ---------------------------------------------------------------- compose
    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"FEDCURE_IMAGE": IMAGE, "BASE_IMAGE": self.base_image,
                    "COMPOSE_HTTP_TIMEOUT": "600"})
        if self.torch_index:
            env["TORCH_INDEX_URL"] = self.torch_index
        env.update(extra)
        return env

    def cmd(self, project: str, files: list[str], *args: str) -> list[str]:
        argv = [*self.compose, "-p", project]
        for f in files:
            argv += ["-f", str(DOCKER_DIR / f)]
        return argv + list(args)


def _pip_setting(key: str) -> str:
    """``pip config`` value of ``key`` (global/user/env scopes), or ""."""
    env_key = "PIP_" + key.upper().replace("-", "_")
    if os.environ.get(env_key):
        return os.environ[env_key]
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                          text=True, timeout=60)
    for line in proc.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.rsplit(".", 1)[-1] == key:
            return value.strip().strip("'\"")
    return ""


@pytest.fixture(scope="module")
def docker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Docker]:
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def report(msg: str) -> None:
        """Straight to the terminal, past pytest's output capture (also with -q)."""
        line = f"[docker] {msg}"
        if tr is None or capture is None:  # pragma: no cover
            print(line)
            return
        with capture.global_and_fixture_disabled():
            tr.ensure_newline()
            tr.write_line(line)

    d = Docker(tmp_path_factory.mktemp("docker"), report)
    try:
        d.start()
        d.pick_base_image()
        d.stage_local_files()
        t0 = time.monotonic()
        _run(d.cmd("fedcuretestbuild", ["compose.yaml"], "build"), env=d.env(), timeout=3600)
        build_s = time.monotonic() - t0
        size = int(_run(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE]).stdout)
        d.report(f"image {IMAGE} on {d.base_image}: build {build_s:.0f} s "
                 f"(with this daemon's layer cache), size {size / 1e6:.0f} MB")
        d.image_size = size
        yield d
    finally:
        d.cleanup_local_files()
        d.stop_dockerd()


def _containers(project: str) -> list[dict[str, Any]]:
    ids = _run(["docker", "ps", "-aq", "--filter",
                f"label=com.docker.compose.project={project}"]).stdout.split()
    if not ids:
        return []
    info = json.loads(_run(["docker", "inspect", *ids]).stdout)
    return [{"name": c["Name"].lstrip("/"),
             "service": c["Config"]["Labels"].get("com.docker.compose.service", "?"),
             "exit": c["State"]["ExitCode"], "status": c["State"]["Status"]} for c in info]


def _compose_run(d: Docker, project: str, files: list[str], results: Path, rounds: int
                 ) -> tuple[float, list[dict[str, Any]], str]:
    """``up`` until every container has exited; (wall seconds, containers, logs). Tears down."""
    from fedcure_app.runtime.processes import free_port

    # the live view's host port: a free one (8080 may be taken on a shared machine)
    env = d.env(FEDCURE_CLIENTS=str(CLIENTS), FEDCURE_ROUNDS=str(rounds),
                FEDCURE_RESULTS=str(results), FEDCURE_TOKEN="compose-test-token",
                FEDCURE_DASHBOARD_PORT=str(free_port()))
    up = d.cmd(project, files, "up", "--no-build", "--no-color", "--scale", f"client={CLIENTS}")
    t0 = time.monotonic()
    try:
        try:
            proc = subprocess.run(up, cwd=REPO, env=env, text=True, capture_output=True,
                                  timeout=UP_TIMEOUT_S)
            up_rc, up_out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            up_rc, up_out = -1, f"timed out after {UP_TIMEOUT_S:.0f} s: {err}"
        wall = time.monotonic() - t0
        containers = _containers(project)
        logs = _run(d.cmd(project, files, "logs", "--no-color"), env=env, check=False,
                    timeout=120)
        log_text = logs.stdout + logs.stderr
        if up_rc != 0:
            pytest.fail(f"`compose up` exited {up_rc}:\n{up_out[-4000:]}\n--- logs ---\n"
                        f"{log_text[-8000:]}", pytrace=False)
        return wall, containers, log_text
    finally:
        _run(d.cmd(project, files, "down", "-v", "--remove-orphans", "--timeout", "20"),
             env=env, check=False, timeout=300)
        left = _containers(project)
        nets = _run(["docker", "network", "ls", "-q", "--filter",
                     f"label=com.docker.compose.project={project}"], check=False).stdout.split()
        assert not left and not nets, f"teardown left containers {left} / networks {nets}"


def _check_run(containers: list[dict[str, Any]], logs: str, results: Path, rounds: int,
               extra_services: set[str], min_accuracy: float) -> dict[str, Any]:
    by_service: dict[str, list[dict[str, Any]]] = {}
    for c in containers:
        by_service.setdefault(c["service"], []).append(c)
    tail = logs[-8000:]
    assert set(by_service) == {"setup", "cloud", "edge0", "edge1", "client"} | extra_services, \
        f"services {sorted(by_service)}\n{tail}"
    assert len(by_service["client"]) == CLIENTS, f"{by_service['client']}\n{tail}"
    bad = [c for c in containers if c["status"] != "exited" or c["exit"] != 0]
    assert not bad, f"containers that did not exit 0: {bad}\n{tail}"
    # a clean shutdown: every client's executor and SuperNode ended on SIGTERM, none was killed
    killed = [ln for ln in logs.splitlines() if "ignored SIGTERM" in ln]
    assert not killed, "\n".join(killed)

    result = json.loads((results / "result.json").read_text())
    assert result["mode"] == "deployment" and result["complete"] is True, tail
    assert result["rounds"] == rounds
    assert result["dataset"] == "digits"
    clients = result["clients"]
    assert len(clients) == CLIENTS
    assert sorted(c["id"] for c in clients) == list(range(CLIENTS))
    # every client name is its container's hostname (fedcure-client's default name without
    # --data or --partition-id): four distinct containers took part
    assert len({c["name"] for c in clients}) == CLIENTS, clients
    assert sorted(result["edges"]) == ["0", "1"]
    assert set(result["edges"].values()) == {"edge0:9092", "edge1:9092"}
    assert all(c["edge"] in (0, 1) for c in clients)
    assert sum(result["participation"]["rounds"]) == rounds
    # the global model learned: better than the initial one (and, given rounds, than chance)
    acc, acc0 = result["final_accuracy"], result["initial_accuracy"]
    assert acc is not None and acc0 is not None and acc > acc0 and acc > min_accuracy, \
        (acc0, acc)
    model = results / "final_model.safetensors"
    assert model.stat().st_size > 10_000
    from safetensors.numpy import load_file

    tensors = load_file(str(model))
    assert tensors and all(v.size > 0 for v in tensors.values())
    pngs = sorted(p.name for p in results.glob("*.png"))
    assert "accuracy.png" in pngs, pngs
    return result


def test_image_runs_every_role_as_non_root(docker: Docker) -> None:
    out = _run(["docker", "run", "--rm", IMAGE, "sh", "-c",
                "id -u && fedcure-cloud --help >/dev/null && fedcure-edge --help >/dev/null "
                "&& fedcure-client --help >/dev/null && fedcure-client --probe"],
               timeout=300).stdout
    uid, _, probe = out.partition("\n")
    assert uid.strip() != "0", "the image must run as a non-root user"
    profile = json.loads(probe[probe.index("{"):])
    assert profile, probe
    # small: torch CPU + Flower + scipy stack, no CUDA, no Ray
    assert docker.image_size < 2_000_000_000, docker.image_size
    _run(["docker", "run", "--rm", IMAGE, "python", "-c",
          "import importlib.util as u, torch; assert not torch.cuda.is_available(); "
          "assert u.find_spec('ray') is None"], timeout=300)


def test_compose_up_four_clients(docker: Docker, tmp_path: Path) -> None:
    results = tmp_path / "results"  # does not exist yet: the setup service's chown matters
    wall, containers, logs = _compose_run(docker, f"fedcuretest{os.getpid()}",
                                          ["compose.yaml"], results, ROUNDS)
    # digits, 10 classes; 6 rounds of the demo settings reach ~0.6 (0.1 is chance)
    result = _check_run(containers, logs, results, ROUNDS, set(), min_accuracy=0.3)
    docker.report(f"compose up (cloud, 2 edges, {CLIENTS} clients, {ROUNDS} rounds, digits): "
                  f"{wall:.0f} s wall; final accuracy {result['final_accuracy']:.3f}")


def test_compose_up_with_tls(docker: Docker, tmp_path: Path) -> None:
    results = tmp_path / "results"
    wall, containers, logs = _compose_run(docker, f"fedcuretesttls{os.getpid()}",
                                          ["compose.yaml", "with-tls.yaml"], results,
                                          TLS_ROUNDS)
    _check_run(containers, logs, results, TLS_ROUNDS, {"certs"}, min_accuracy=0.1)
    assert "WITHOUT TLS" not in logs, logs[-4000:]
    assert "serving TLS with mutual authentication" in logs, logs[-4000:]
    docker.report(f"compose up with TLS ({CLIENTS} clients, {TLS_ROUNDS} rounds): "
                  f"{wall:.0f} s wall")


OWN_ROUNDS = int(os.environ.get("FEDCURE_DOCKER_OWN_ROUNDS", "4"))


def test_compose_up_on_the_clients_own_data(docker: Docker, tmp_path: Path) -> None:
    """docker/own-data.yaml: eight client services, each mounting only its own folder of
    the worked example read-only; the cloud runs the task and evaluates on the clients'
    held-out parts."""
    from fedcure_app.runtime.processes import free_port

    clients, results, task = tmp_path / "clients", tmp_path / "results", tmp_path / "task.toml"
    _run([sys.executable, str(REPO / "examples" / "digits_folders.py"), str(clients),
          "--size", "8"], timeout=300)
    _run([sys.executable, "-m", "fedcure_app.cli", "task", "init", str(clients), "--out",
          str(task)], timeout=300)
    for p in [clients, *clients.rglob("*")]:  # the image's non-root user reads them
        p.chmod(0o755 if p.is_dir() else 0o644)
    task.chmod(0o644)
    files = ["compose.yaml", "own-data.yaml"]
    project = f"fedcuretestown{os.getpid()}"
    env = docker.env(FEDCURE_ROUNDS=str(OWN_ROUNDS), FEDCURE_RESULTS=str(results),
                     FEDCURE_TOKEN="compose-test-token", FEDCURE_CLIENTS_DATA=str(clients),
                     FEDCURE_TASK=str(task), FEDCURE_DASHBOARD_PORT=str(free_port()))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(docker.cmd(project, files, "up", "--no-build", "--no-color"),
                              cwd=REPO, env=env, text=True, capture_output=True,
                              timeout=UP_TIMEOUT_S)
        wall = time.monotonic() - t0
        containers = _containers(project)
        mounts = {c: json.loads(_run(["docker", "inspect", "-f", "{{json .Mounts}}", c]
                                     ).stdout) for c in (x["name"] for x in containers)}
        logs = _run(docker.cmd(project, files, "logs", "--no-color"), env=env, check=False,
                    timeout=120)
        text = logs.stdout + logs.stderr
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}\n{text[-6000:]}"
    finally:
        _run(docker.cmd(project, files, "down", "-v", "--remove-orphans", "--timeout", "20"),
             env=env, check=False, timeout=300)
    own = sorted((c for c in containers if c["service"].startswith("own-client-")),
                 key=lambda c: c["service"])
    assert len(own) == 8 and not any(c["service"] == "client" for c in containers)
    bad = [c for c in containers if c["exit"] != 0]
    assert not bad, f"{bad}\n{text[-6000:]}"
    for c in own:
        sources = [m["Source"] for m in mounts[c["name"]] if m["Type"] == "bind"]
        entry = "client-" + c["service"].rsplit("-", 1)[1]
        assert sources == [str(clients / entry)], (c["service"], sources)
        assert all(not m["RW"] for m in mounts[c["name"]] if m["Type"] == "bind")
    result = json.loads((results / "result.json").read_text())
    assert result["evaluation"] == "federated" and result["rounds"] == OWN_ROUNDS
    assert sorted(c["name"] for c in result["clients"]) == [f"client-{i:02d}" for i in range(8)]
    assert result["formed_jsd"] < result["initial_jsd"]
    acc, acc0 = result["final_accuracy"], result["initial_accuracy"]
    assert acc is not None and acc0 is not None and acc > acc0, (acc0, acc)
    docker.report(f"compose up on own data (8 clients, {OWN_ROUNDS} rounds): {wall:.0f} s "
                  f"wall; federated accuracy {acc0:.3f} -> {acc:.3f}")
