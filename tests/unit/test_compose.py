"""docker-compose.yml is one a user can trust (issue 28, item 5): every image pinned to a version, a healthcheck on
every long-running service, the project image built by every service that runs it, with the de-duplication model.

That the file loads as ``docker compose config`` loads it is checked by ``make compose-check`` (in ``.ci/run``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")  # PyYAML (comes with the embeddings extra's huggingface_hub)

ROOT = Path(__file__).resolve().parents[2]


def services() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"])


def test_every_image_is_pinned_to_a_version() -> None:
    for name, svc in services().items():
        image = svc["image"]
        if image == "combee:local":
            continue
        tag = image.partition(":")[2]
        # a version of at least major.minor.patch (v2.55.1, 7.4.2, 4.4.0): not latest, not a bare major like 7
        assert re.fullmatch(r"v?\d+\.\d+\.\d+([-.][\w.]+)?", tag), f"{name}: {image} is not pinned to a version"
    base = re.search(r"^FROM (\S+)", (ROOT / "deploy" / "Dockerfile").read_text(), re.M)
    assert base is not None and re.fullmatch(r"python:3\.11\.\d+-slim-\w+", base.group(1)), base


def test_every_service_has_a_healthcheck_and_the_project_image_is_built() -> None:
    for name, svc in services().items():
        check = svc.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        if check.get("disable"):
            assert svc.get("restart") == "on-failure" and "command" in svc, f"{name}: only a one-shot may disable it"
            dependants = [s for s in services().values() if name in (s.get("depends_on") or {})]
            assert all(d["depends_on"][name]["condition"] == "service_completed_successfully" for d in dependants)
        else:
            assert check["test"][0] == "CMD" and check.get("interval"), f"{name}: {check}"
        if svc["image"] == "combee:local":
            assert svc.get("build", {}).get("dockerfile") == "deploy/Dockerfile", f"{name} runs combee:local unbuilt"


def test_the_image_has_the_deduplication_model() -> None:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "pip install '.[embeddings]'" in text and "python -m combee.embed_local install" in text
    assert "local_embedder_missing" in text  # the build fails when the model is not in place
