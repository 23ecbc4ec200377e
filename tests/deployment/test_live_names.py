"""The live view names each client as it registered (``NAME (#ID)`` on the page): the cloud's
names are the roster's (those ``result.json`` lists), ``fedcure simulate --dashboard`` gives the
clients folder's entry names; only a viewer the view already admits gets them (a token-guarded
view answers 401 without its token, and ``Monitor.Status`` carries no names); a name is shown as
text, never as markup."""

from __future__ import annotations

import json

from cloud_server.live import live_state, start_dashboard
from fedcure_app.live.server import LiveServer
from tests.deployment.fakes import FakeEdge, make_cfg, register_request, start_cloud
from tests.deployment.test_cloud import one_hot, register_all, status
from tests.deployment.test_live_view import get

#: registered in this order; ids follow the names' natural order, not the arrival
NAMES = ["site-10", "pi-kitchen", "site-2", "<img src=x onerror=document.title='owned'>"]


def named_cloud(cleanup, edges: int = 2):
    """A running cloud whose clients registered as :data:`NAMES`: the server, its fake edges
    and ``{client id: name}`` as the cloud answered them."""
    server = start_cloud(make_cfg(len(NAMES), edges, **{"global-rounds": 10,
                                                         "max-concurrent": edges}),
                         expected=len(NAMES))
    cleanup.append(server)
    fakes = [FakeEdge(server.address, m) for m in range(edges)]
    cleanup.extend(fakes)
    reqs = [register_request(n, one_hot(i), home=i % edges) for i, n in enumerate(NAMES)]
    replies = register_all(server.address, reqs)
    return server, fakes, {r.client_id: q.client_name for q, r in zip(reqs, replies)}


def test_a_registered_clients_name_reaches_the_pages_state(cleanup):
    server, fakes, names = named_cloud(cleanup)
    live = start_dashboard(server.service.controller, "127.0.0.1", 0, interval_s=0.1)
    cleanup.append(live)
    fakes[0].submit(fakes[0].next_task())  # names stay as the rounds go on
    s = json.loads(get(live.url + "api/state")[1])
    assert s["round"] == 1
    assert {c["client"]: c["name"] for c in s["clients"]} == names
    # the names the cloud writes to result.json, by the same ids
    roster = {c.client_id: c.name for c in server.service.controller.roster.by_id()}
    assert roster == names
    # every coalition member is a client row, so the page can name it
    assert {m for c in s["coalitions"] for m in c["members"]} == set(names)
    assert "127.0.0.1" not in json.dumps(s)  # names, never addresses
    # Monitor.Status, answered without a token, still carries ids only
    assert not any(n in str(status(server.address)) for n in NAMES)


def test_a_token_guarded_view_gives_names_only_with_its_token(cleanup):
    server, _, names = named_cloud(cleanup)
    token = "names-token"
    live = LiveServer(lambda: live_state(server.service.controller), "127.0.0.1", 0,
                      token=token)
    live.start()
    cleanup.append(live)
    for path in ("api/state", "events"):
        code, body = get(live.url + path)
        assert code == 401 and not any(n.encode() in body for n in NAMES), path
    code, body = get(live.url + f"api/state?token={token}")
    assert code == 200
    assert {c["client"]: c["name"] for c in json.loads(body)["clients"]} == names


#: the client cells of both tables once the page shows them (null before)
CELLS = """(() => {
  const rows = [...document.querySelectorAll('#clients-table tbody tr')];
  const co = [...document.querySelectorAll('#coalitions tbody tr')];
  if (!rows.length || !co.length) return null;
  return {
    clients: rows.map((tr) => [tr.dataset.client, tr.children[0].textContent]),
    members: co.map((tr) => tr.querySelector('td.members').textContent),
    elements: document.querySelectorAll('main img, main td *:not(span)').length,
    title: document.title,
  };
})()"""


def test_the_page_shows_each_client_by_name_and_id_as_text(cleanup, tmp_path):
    from tests.deployment.browser import Chromium

    server, _, names = named_cloud(cleanup)
    live = start_dashboard(server.service.controller, "127.0.0.1", 0, interval_s=0.1)
    cleanup.append(live)
    browser = Chromium(tmp_path / "profile", width=1400, height=1500)
    try:
        browser.open(live.url)
        shown = browser.wait_for(CELLS)
    finally:
        browser.close()
    assert shown is not None, "the page never showed the clients"
    # the client table's cell may wrap before the id; a member list only between members
    assert {int(c): text for c, text in shown["clients"]} == {
        c: f"{n} (#{c})" for c, n in names.items()}, shown
    label = {c: f"{n}\u00a0(#{c})" for c, n in names.items()}
    coalitions = server.service.controller.strategy.coalitions
    assert shown["members"] == [", ".join(label[c] for c in ids) for ids in coalitions], shown
    # a name that looks like markup stays text: no element made, nothing run
    assert shown["elements"] == 0 and "owned" not in shown["title"], shown


def test_simulate_names_the_clients_left_by_their_entries(tmp_path, monkeypatch):
    from fedcure_app.cli import main
    from fedcure_app.data.task import task_toml
    from fedcure_app.live.simulation import SimulationFeed
    from tests.owndata.test_own_refusals import TASK, write_clients

    write_clients(tmp_path / "clients", good=3)  # and site-9, refused
    (tmp_path / "task.toml").write_text(task_toml(TASK))
    seen: list[dict] = []
    finish = SimulationFeed.finish

    def recorded(feed: SimulationFeed) -> None:
        seen.append(feed().to_json())  # what /api/state serves
        finish(feed)

    monkeypatch.setattr(SimulationFeed, "finish", recorded)
    code = main(["simulate", "--task", str(tmp_path / "task.toml"), "--clients-data",
                 str(tmp_path / "clients"), "--edges", "2", "--rounds", "2", "--tau-e", "1",
                 "--workers", "1", "--no-progress", "--out", str(tmp_path / "out"),
                 "--dashboard", "127.0.0.1:0"])
    assert code == 0 and len(seen) == 1
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert {c["client"]: c["name"] for c in seen[0]["clients"]} == dict(
        enumerate(result["clients"])) == {0: "site-0", 1: "site-1", 2: "site-2"}
    # the device types are those of the three clients the engine trains (site-9 refused)
    from fedcure_app.config import build_config
    from fedcure_app.federation import profiles_for

    trained = build_config(result["config"])
    assert trained.federation.num_clients == seen[0]["expected_clients"] == 3
    assert [c["device"] for c in seen[0]["clients"]] == [p.name for p in profiles_for(trained)]
