"""A newcomer's first lines: ``fedcure task init`` says how many clients it found in the same
words for images and for tables, and the README says where to make a virtual environment
before its install line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedcure_app.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def image_clients(root: Path) -> None:
    from PIL import Image

    for c in range(3):
        for label in ("a", "b"):
            folder = root / f"client-{c}" / label
            folder.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(np.full((4, 4), 40 * i, np.uint8)).save(folder / f"{i}.png")


def csv_clients(root: Path) -> None:
    root.mkdir(parents=True)
    for c in range(3):
        (root / f"client-{c}.csv").write_text("x,label\n1,a\n2,b\n3,a\n")


@pytest.mark.parametrize("write, kind", [(image_clients, "image"), (csv_clients, "tabular")])
def test_task_init_says_found_n_clients_alike_for_images_and_tables(tmp_path, capsys, write,
                                                                      kind):
    write(tmp_path / "clients")
    assert main(["task", "init", str(tmp_path / "clients"), "--out",
                 str(tmp_path / "task.toml")]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"found 3 clients in {tmp_path / 'clients'} ({kind} data)"


def test_the_readme_says_where_to_make_a_venv_before_the_install_line():
    text = README.read_text()
    venv = text.index("python3 -m venv .venv && . .venv/bin/activate")
    assert venv < text.index("python3 -m pip install")
    line = next(ln for ln in text.splitlines() if "python3 -m venv" in ln)
    assert "in the clone" in line and len(line) <= 100
