"""The cloud's live view (fedcure_app.live, cloud_server.live): the page, its event stream and
/metrics show the run's state as Monitor.Status and the controller know it, read a snapshot
without the cloud's lock, and refuse what they must (a non-loopback address without a token,
requests without the token, writes)."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cloud_server.cli import main as cloud_main
from cloud_server.live import live_state, start_dashboard
from fedcure_app.live.metrics import METRICS
from fedcure_app.live.server import DashboardError, LiveServer, check_bind, static_file
from tests.deployment.test_cloud import federation, status


def get(url: str, headers: dict | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def metrics(url: str) -> dict[str, list]:
    code, body = get(url + "metrics")
    assert code == 200
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def one(samples: dict, name: str, **labels) -> float:
    got = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (name, labels, samples.get(name))
    return got[0]


@pytest.fixture
def running(cleanup):
    server, fakes, _, replies = federation(cleanup, clients=6, edges=3,
                                           **{"max-concurrent": 2, "global-rounds": 20})
    live = start_dashboard(server.service.controller, "127.0.0.1", 0, interval_s=0.1)
    cleanup.append(live)
    return server, fakes, replies, live


def test_the_page_and_its_state_match_monitor_status(running):
    server, fakes, replies, live = running
    code, page = get(live.url)
    assert code == 200 and b"static/app.js" in page and b"http" not in page.split(b"<body>")[1]
    assert get(live.url + "static/app.js")[1] == static_file("app.js")
    tasks = {f.edge_id: f.next_task() for f in fakes[:2]}
    fakes[0].submit(tasks[0])
    s = json.loads(get(live.url + "api/state")[1])
    st = status(server.address)
    assert (s["phase"], s["round"], s["version"]) == ("training", st.round, st.version) == (
        "training", 1, 1)
    assert (s["clients_registered"], s["edges_connected"]) == (6, 3)
    members = {m: sorted(r.client_id for r in replies if r.edge_id == m) for m in range(3)}
    assert {c["coalition"]: c["members"] for c in s["coalitions"]} == members
    training = {c["coalition"] for c in s["coalitions"] if c["state"] == "training"}
    assert training == set(st.in_flight)
    assert len(s["history"]) == 1 and s["history"][0][s["round_fields"].index("coalition")] == 0
    # per client: the directive of its task and the frequency it reported applying
    freq = {c["client"]: c for c in s["clients"]}
    for c, f in tasks[0].frequencies_ghz.items():
        assert freq[c]["directive_ghz"] == pytest.approx(f)
        assert freq[c]["applied_ghz"] == pytest.approx(f)
    # and its device type, as it registered (the fakes register as rpi4)
    assert {c["device"] for c in s["clients"]} == {"rpi4"} and len(s["clients"]) == 6
    # each client by the name it registered with (client-N here); never an address
    assert {c["client"]: c["name"] for c in s["clients"]} == {
        r.client_id: f"client-{r.client_id}" for r in replies}
    assert "127.0.0.1" not in json.dumps(s)


def test_metrics_carry_the_documented_names_and_follow_the_run(running):
    server, fakes, _, live = running
    task = fakes[0].next_task()
    before = metrics(live.url)
    assert one(before, "fedcure_global_version") == 0
    fakes[0].submit(task)
    with pytest.raises(Exception):  # a task the cloud does not know: NOT_FOUND
        fakes[0].submit(task, task_id="r9-c0-v9")
    m = metrics(live.url)
    c = server.service.controller
    assert one(m, "fedcure_global_version") == c.strategy.version == 1
    assert one(m, "fedcure_global_rounds_total") == 1
    assert one(m, "fedcure_updates_accepted_total") == 1
    assert one(m, "fedcure_updates_refused_total", reason="NOT_FOUND") == 1
    assert one(m, "fedcure_phase", phase="training") == 1
    assert one(m, "fedcure_task_latency_seconds_count", coalition="0") == 1
    assert one(m, "fedcure_clients_registered") == 6 and one(m, "fedcure_edges_connected") == 3
    for k in range(3):
        assert one(m, "fedcure_virtual_queue", coalition=str(k)) == pytest.approx(
            c.strategy.scheduler.queues.values[k])
        assert one(m, "fedcure_latency_estimate_seconds", coalition=str(k)) == pytest.approx(
            c.strategy.estimator.mean()[k])
        assert one(m, "fedcure_target_share", coalition=str(k)) == pytest.approx(
            c.strategy.delta[k])
    for cid, f in task.frequencies_ghz.items():
        assert one(m, "fedcure_client_applied_ghz", client=str(cid)) == pytest.approx(f)
    # every family the collector yields is documented
    names = {n.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
             .removesuffix("_bucket") for n in m}
    assert names <= set(METRICS) | {"fedcure_task_latency_seconds"}


def test_readers_never_wait_for_the_cloud_lock(running):
    server, fakes, _, live = running
    fakes[0].submit(fakes[0].next_task())
    c = server.service.controller
    with c.lock:  # the cloud busy in a transition: page, state and metrics still answer
        assert get(live.url + "metrics", timeout=3)[0] == 200
        assert json.loads(get(live.url + "api/state", timeout=3)[1])["round"] == 1
        assert live_state(c).round == 1


def test_the_event_stream_sends_each_round_once(running):
    server, fakes, _, live = running
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=10)
    conn.request("GET", "/events")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"

    def events():
        buf = b""
        while True:
            line = resp.fp.readline()
            if line == b"\n" and buf:
                yield json.loads(buf.decode()[len("data: "):])
                buf = b""
            elif line.startswith(b"data: "):
                buf = line.rstrip(b"\n")

    stream = events()
    first = next(stream)
    assert first["round"] == 0 and first["history"] == [] and first["history_from"] == 0
    fakes[0].submit(fakes[0].next_task())
    ev = next(stream)
    while ev["round"] < 1:
        ev = next(stream)
    assert ev["history_from"] == 0 and len(ev["history"]) == 1
    fakes[1].submit(fakes[1].next_task())
    ev = next(stream)
    while ev["round"] < 2:
        ev = next(stream)
    assert ev["history_from"] == 1 and len(ev["history"]) == 1  # only the new round
    conn.close()


def test_an_exposed_view_needs_a_token_and_requests_without_it_get_401(cleanup, capsys):
    with pytest.raises(DashboardError, match="--dashboard-token"):
        check_bind("0.0.0.0:8080", "")
    assert check_bind("127.0.0.1:8080", "") == ("127.0.0.1", 8080)
    assert check_bind("[::1]:8080", "") == ("::1", 8080)
    code = cloud_main(["--listen", "127.0.0.1:0", "--expected-clients", "2", "--edges", "1",
                       "--insecure", "--dashboard", "0.0.0.0:0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dashboard-token" in err[0], err

    server, _, _, _ = federation(cleanup, clients=2, edges=1)
    token = "s3cret-token"
    live = LiveServer(lambda: live_state(server.service.controller), "127.0.0.1", 0,
                      token=token)
    live.start()
    cleanup.append(live)
    for path in ("", "metrics", "api/state", "events", "static/app.js"):
        assert get(live.url + path)[0] == 401, path
        assert get(live.url + path + "?token=wrong-token")[0] == 401, path
    assert get(live.url + "metrics", {"Authorization": f"Bearer {token}"})[0] == 200
    assert get(live.url + f"api/state?token={token}")[0] == 200
    req = urllib.request.Request(live.url + f"api/state?token={token}", data=b"x",
                                 method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 405


def test_a_loopback_view_refuses_foreign_host_names(running):
    _, _, _, live = running
    assert get(live.url, {"Host": "attacker.example:8080"})[0] == 403
    assert get(live.url, {"Host": f"localhost:{live.port}"})[0] == 200


def test_launch_refuses_an_exposed_view_without_a_token_before_starting_anything(tmp_path,
                                                                                 capsys):
    from fedcure_app.cli import main

    out = tmp_path / "run"
    code = main(["launch", "--edges", "1", "--clients", "1", "--out", str(out),
                 "--dashboard", "0.0.0.0:8080", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--dashboard-token" in err[0], err
    assert not (out / "logs").exists()


def test_launch_moves_a_busy_dashboard_port_to_the_next_free_one():
    import socket

    from fedcure_app.live.server import dashboard_address

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        host, _, got = dashboard_address(f"127.0.0.1:{port}").rpartition(":")
        assert host == "127.0.0.1" and port < int(got) < port + 20
    assert int(dashboard_address("127.0.0.1:0").rpartition(":")[2]) > 0


def test_the_view_serves_https_with_the_cloud_certificate(running, tmp_path):
    import ssl

    from fedcure_app.cli import main

    server, _, _, _ = running
    certs = tmp_path / "certs"
    assert main(["certs", "--out", str(certs), "--hosts", "localhost,127.0.0.1"]) == 0
    live = LiveServer(lambda: live_state(server.service.controller), "127.0.0.1", 0,
                      token="https-token", tls=(str(certs / "server.crt"),
                                                str(certs / "server.key")))
    live.start()
    try:
        assert live.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        req = urllib.request.Request(live.url + "api/state",
                                     headers={"Authorization": "Bearer https-token"})
        with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
            assert json.loads(resp.read())["phase"] == "training"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(live.url + "metrics", timeout=5, context=ctx)
        assert refused.value.code == 401
        # plain HTTP is not answered
        with pytest.raises((urllib.error.URLError, http.client.HTTPException, OSError)):
            urllib.request.urlopen(live.url.replace("https", "http") + "metrics", timeout=5)
    finally:
        live.stop()


#: what each chart and table of the page says about its marks, read from the DOM once the page
#: shows round N (null before)
LABELS = """(() => {
  if (!document.body || !(+document.body.dataset.round >= %d)) return null;
  const texts = (sel) => [...document.querySelectorAll(sel)].map((t) => t.textContent);
  const outside = (id) => {
    const box = document.getElementById(id).getBoundingClientRect();
    return texts('#' + id + ' text').filter((_, i) => {
      const r = document.querySelectorAll('#' + id + ' text')[i].getBoundingClientRect();
      return r.left < box.left - 0.5 || r.right > box.right + 0.5;
    });
  };
  return {
    latencyLegend: texts('#latency text.legend'),
    queueTicks: texts('#queues text.xtick'),
    latencyTicks: texts('#latency text.xtick'),
    accTicks: texts('#acc text.xtick'),
    dots: document.querySelectorAll('#latency .mark-dot').length,
    bars: document.querySelectorAll('#latency .mark-tick').length,
    clipped: ['queues', 'shares', 'latency', 'acc'].flatMap(outside),
    freqLegend: document.getElementById('freq-legend').textContent.replace(/\\s+/g, ' '),
    footer: document.querySelector('footer').textContent.replace(/\\s+/g, ' '),
    mainBottom: document.querySelector('main').getBoundingClientRect().bottom,
    height: window.innerHeight,
  };
})()"""


def test_the_page_in_chromium_says_what_each_mark_is(running, tmp_path):
    """In a 1400x1800 window: the latency chart's legend tells a measurement (dot) from the
    T̂ it was dispatched with (a bar), one of each per answered task; round axes have whole
    numbers; no tick label is cut at a chart's edge; the frequency table says what directive
    and applied are and why they differ; the footer speaks to the user; the charts fill most
    of the window."""
    import queue
    import time

    from tests.deployment.browser import Chromium

    server, fakes, replies, live = running
    answered = 0
    end = time.monotonic() + 60
    while answered < 5 and time.monotonic() < end:
        for fake in fakes:
            if answered == 5:
                break
            try:
                task = fake.tasks.get(timeout=0.1)
            except queue.Empty:
                continue
            fake.submit(task)
            answered += 1
    assert answered == 5
    browser = Chromium(tmp_path / "profile", width=1400, height=1800)
    try:
        browser.open(live.url)
        shown = browser.wait_for(LABELS % answered)
        browser.screenshot(tmp_path / "live-view.png")
    finally:
        browser.close()
    assert shown is not None, "the page never showed the answered rounds"
    assert shown["latencyLegend"][-2:] == ["measured", "T̂ at dispatch"], shown
    assert {"c0", "c1", "c2"} <= set(shown["latencyLegend"]), shown
    # the legend has one mark of each kind; the chart one dot and one bar per answer
    assert shown["dots"] == shown["bars"] == answered + 1, shown
    for ticks in (shown["queueTicks"], shown["latencyTicks"]):
        assert ticks and all(t.isdigit() for t in ticks), shown
        assert [int(t) for t in ticks] == sorted({int(t) for t in ticks}), shown
    assert shown["clipped"] == [], shown
    assert "directive" in shown["freqLegend"] and "applied" in shown["freqLegend"]
    assert "in flight" in shown["freqLegend"], shown["freqLegend"]
    assert "Monitor.Status" not in shown["footer"], shown["footer"]
    assert shown["mainBottom"] >= 0.75 * shown["height"], shown


#: how the page fits a window, read from the DOM once it shows the clients' frequencies
LAYOUT = """(() => {
  const rows = [...document.querySelectorAll('#clients-table tbody tr')];
  if (!rows.length || !document.getElementById('coalitions').tBodies[0].rows.length) return null;
  const inner = (el) => { const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return [r.left + parseFloat(s.paddingLeft), r.right - parseFloat(s.paddingRight)]; };
  const card = inner(document.getElementById('clients-table').closest('section'));
  // the lines a cell's text takes (not the cell's height: a row is as tall as its tallest cell)
  const lines = (td) => { const r = document.createRange(); r.selectNodeContents(td);
    return r.getClientRects().length; };
  return {
    title: document.title,
    heading: document.querySelector('h1').textContent,
    overflowing: [...document.querySelectorAll('section')].filter(
      (sec) => sec.scrollWidth > sec.clientWidth + 1).map((sec) => sec.querySelector('h2').textContent),
    barCells: rows.map((tr) => { const r = tr.lastElementChild.getBoundingClientRect();
      return [r.left, r.right]; }),
    bars: rows.map((tr) => [...tr.querySelectorAll('.bar')].map((b) => b.getBoundingClientRect().width)),
    clientCells: rows.map((tr) => tr.children[0].textContent),
    devicesWrapped: rows.filter((tr) => lines(tr.children[2]) > 1).length,
    clientLines: rows.map((tr) => lines(tr.children[0])),
    card: card,
    legend: document.getElementById('coalition-legend').textContent.replace(/\\s+/g, ' '),
    versionNote: document.getElementById('version').parentElement.textContent.replace(/\\s+/g, ' '),
    etas: [...document.querySelectorAll('#coalitions tbody tr')].map((tr) =>
      [...tr.children].map((td) => td.textContent)),
  };
})()"""

#: windows the page must fit (CSS pixels): the issue's tall 1400-pixel window first
WINDOWS = [(1400, 2000), (1400, 1800), (1920, 1080), (2560, 1440), (1000, 900), (480, 900)]


def test_the_page_fits_every_window_and_explains_its_figures(cleanup, tmp_path):
    """Nine clients with the longest preset name (``jetson-orin-nano``) and a Pi 3, three
    coalitions, a testbed's view: in every window of :data:`WINDOWS` no card's content is wider
    than the card, every row of the frequency table keeps its bar column inside the card with
    both bars drawn, the device names stay on one line; the title names the mode; a legend says
    what T̂, ETA, δ, Λ and share are; the model version says how it relates to the global
    round."""
    from tests.deployment.browser import Chromium
    from tests.deployment.fakes import FakeEdge, make_cfg, register_request, start_cloud
    from tests.deployment.test_cloud import one_hot, register_all

    server = start_cloud(make_cfg(9, 3, **{"max-concurrent": 3, "global-rounds": 20}),
                         expected=9)
    cleanup.append(server)
    fakes = [FakeEdge(server.address, m) for m in range(3)]
    cleanup.extend(fakes)
    mix = ["jetson-orin-nano"] * 5 + ["rpi3"]
    register_all(server.address, [register_request(f"client-{i}", one_hot(i), home=i % 3,
                                                   preset=mix[i % 6]) for i in range(9)])
    tasks = [f.next_task(20) for f in fakes]
    assert fakes[0].submit(tasks[0]).accepted  # an applied frequency for coalition 0's clients
    live = start_dashboard(server.service.controller, "127.0.0.1", 0, interval_s=0.1,
                           mode="testbed")
    cleanup.append(live)
    browser = Chromium(tmp_path / "profile", width=1400, height=2000)
    seen = {}
    try:
        browser.open(live.url)
        for w, h in WINDOWS:
            browser.viewport(w, h)
            shown = browser.wait_for(LAYOUT)
            assert shown is not None, f"{w}x{h}: the page never showed the clients"
            seen[(w, h)] = shown
            if (w, h) == WINDOWS[0]:
                browser.screenshot(tmp_path / "live-view-1400x2000.png")
    finally:
        browser.close()
    for (w, h), shown in seen.items():
        where = f"{w}x{h}: {shown}"
        # the coalition table, 12 columns, may scroll in its card below 1000 pixels; no other
        assert shown["overflowing"] == ([] if w >= 1000 else shown["overflowing"][:1]), where
        assert shown["overflowing"] in ([], ["Coalitions"]), where
        left, right = shown["card"]
        assert all(left - 0.5 <= a and b <= right + 0.5 for a, b in shown["barCells"]), where
        assert all(len(b) == 2 and b[0] > 0 for b in shown["bars"]), where
        assert sum(1 for b in shown["bars"] if b[1] > 0) == 3, where  # coalition 0 answered
        assert shown["devicesWrapped"] == 0, where
        # each client by its registered name and id, and still inside its card
        assert shown["clientCells"] == [f"client-{i} (#{i})" for i in range(9)], where
        assert all(1 <= n <= 2 for n in shown["clientLines"]), where  # the id may go below
    shown = seen[WINDOWS[0]]
    assert shown["title"] == "FedCure live view: testbed", shown
    assert "testbed" in shown["heading"] and "deployment" not in shown["heading"], shown
    for word in ("T̂ estimated task latency", "ETA what is left of T̂", "δ target share",
                 "Λ virtual queue: participation debt", "share of the rounds so far"):
        assert word in shown["legend"], (word, shown["legend"])
    assert "model version" in shown["versionNote"], shown["versionNote"]
    assert "one per global round" in shown["versionNote"], shown["versionNote"]
