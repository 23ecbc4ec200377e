"""Write a compose overlay that runs FedCure on the clients' own data: one client service per
entry of a clients folder, each mounting only its own entry, read-only.

    python3 docker/own_data_overlay.py CLIENTS_DIR > docker/my-own-data.yaml
    FEDCURE_CLIENTS_DATA=/abs/CLIENTS_DIR FEDCURE_TASK=/abs/task.toml \\
        docker compose -f docker/compose.yaml -f docker/my-own-data.yaml up

``docker/own-data.yaml`` is this script's output for the worked example
(``examples/digits_folders.py``: client-00 … client-07). The overlay's cloud reads the task
file and evaluates on the clients' held-out parts (federated evaluation); the base file's
scaled ``client`` service is set to 0 replicas. Standard library only: it runs where
FedCure is not installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: the client data formats a folder entry may be (see docs/own-data.md)
SUFFIXES = (".npz", ".csv")

HEAD = """\
# FedCure on the clients' own data, layered on compose.yaml: one client service per entry of
# FEDCURE_CLIENTS_DATA, each mounting only its own entry (read-only at /own); the cloud reads
# the task file FEDCURE_TASK and evaluates the global model on the clients' held-out parts.
#
#     python3 examples/digits_folders.py /abs/clients && fedcure task init /abs/clients --out /abs/task.toml
#     FEDCURE_CLIENTS_DATA=/abs/clients FEDCURE_TASK=/abs/task.toml \\
#         docker compose -f docker/compose.yaml -f docker/own-data.yaml up
#
# Written by `python3 docker/own_data_overlay.py CLIENTS_DIR` for {n} entries ({names}); write
# your own for another folder the same way.

x-own-client: &own-client
  image: ${{FEDCURE_IMAGE:-fedcure:latest}}
  restart: "no"
  environment:
    FEDCURE_TOKEN: ${{FEDCURE_TOKEN:-fedcure-compose-demo}}
  depends_on:
    cloud:
      condition: service_healthy
    edge0:
      condition: service_healthy
    edge1:
      condition: service_healthy

services:
  # FEDCURE_TASK and FEDCURE_CLIENTS_DATA are checked here, when `up` starts a run (the cloud
  # waits for this check), so that `down -v` and `config` need neither
  check:
    image: ${{FEDCURE_IMAGE:-fedcure:latest}}
    restart: "no"
    environment:
      FEDCURE_TASK: ${{FEDCURE_TASK:-}}
      FEDCURE_CLIENTS_DATA: ${{FEDCURE_CLIENTS_DATA:-}}
    command:
      - sh
      - -c
      - >-
        test -n "$$FEDCURE_TASK" || {{ echo 'set FEDCURE_TASK to the task file
        (fedcure task init)' >&2; exit 2; }};
        test -n "$$FEDCURE_CLIENTS_DATA" || {{ echo 'set FEDCURE_CLIENTS_DATA to the clients
        folder' >&2; exit 2; }}

  cloud:
    depends_on:
      check:
        condition: service_completed_successfully
    command:
      - fedcure-cloud
      - --listen=0.0.0.0:9090
      - --expected-clients={n}
      - --edges=2
      - --rounds=${{FEDCURE_ROUNDS:-10}}
      - --config=/etc/fedcure/own-data.toml
      - --task=/etc/fedcure/task.toml
      - --out=/results
      - --register-timeout=600
      - --insecure
      - --dashboard=0.0.0.0:8080
    volumes:
      # deployment settings only: the task trains with the defaults, as under simulate/launch
      - ./own-data.toml:/etc/fedcure/own-data.toml:ro
      - ${{FEDCURE_TASK:-/dev/null}}:/etc/fedcure/task.toml:ro

  # the base file's clients share one dataset; here every client is its own service
  client:
    scale: 0
"""

CLIENT = """
  {service}:
    <<: *own-client
    command: ["fedcure-client", "--cloud=cloud:9090", "--name={name}",
              "--partition-id={index}", "--data=/own{suffix}", "--cpufreq=emulate",
              "--insecure"]
    volumes:
      - ${{FEDCURE_CLIENTS_DATA:-/dev/null}}/{entry}:/own{suffix}:ro
"""


def entries(folder: Path) -> list[Path]:
    """The client entries of ``folder`` as FedCure lists them: visible folders and
    ``.npz``/``.csv`` files, sorted by name."""
    return sorted((p for p in folder.iterdir() if not p.name.startswith(".")
                   and (p.is_dir() or p.suffix.lower() in SUFFIXES)), key=lambda p: p.name)


def overlay(names: list[str]) -> str:
    """The overlay's text for client entries ``names`` (in client order)."""
    shown = ", ".join(names) if len(names) <= 4 else f"{names[0]} … {names[-1]}"
    text = HEAD.format(n=len(names), names=shown)
    for i, name in enumerate(names):
        suffix = Path(name).suffix.lower() if Path(name).suffix.lower() in SUFFIXES else ""
        service = "own-" + "".join(c if c.isalnum() else "-" for c in Path(name).stem).lower()
        # a client goes by its entry's name without the .csv/.npz suffix (as under launch)
        text += CLIENT.format(service=service, name=Path(name).stem if suffix else name,
                              entry=name, index=i, suffix=suffix)
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python3 docker/own_data_overlay.py CLIENTS_DIR > overlay.yaml",
              file=sys.stderr)
        return 2
    names = [p.name for p in entries(Path(argv[0]))]
    if not names:
        print(f"{argv[0]}: no client folders, .npz or .csv files", file=sys.stderr)
        return 2
    sys.stdout.write(overlay(names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
