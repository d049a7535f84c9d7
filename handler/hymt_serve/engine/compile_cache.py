"""The fast engine's compile cache: what compiling and autotuning produce, kept on disk and
reused by the next start with the same model, card, precision, engine shape and code.

What is kept is torch's own: inductor's FX graph cache and autotuning results
(``TORCHINDUCTOR_CACHE_DIR``) and Triton's kernel cache (``TRITON_CACHE_DIR``), which also
holds our own kernels compiled ahead (:mod:`hymt_serve.engine.kernels.ahead`) and the C
launchers Triton builds. Both are pointed into one folder per key under the configured root
(``compile_cache_dir``). CUDA graphs cannot be saved: they are captured again at every start,
over the kernels the cache gives back.

The key is a hash of :func:`key_inputs`, written beside the cache in ``manifest.json``. A folder
whose manifest does not equal this start's inputs is never used: it is set aside and removed,
and a new one is made. torch's caches check each entry again (graph, torch and Triton versions,
device), so this key is the outer guard: a cache for another model, card or code is not even
opened. Several engine processes may start at once: a key's folder is made under a temporary
name and renamed into place (one rename wins, the others use the winner's), and torch and
Triton write each entry to a temporary file and rename it. A folder becomes "complete" when a
build finishes on it; one that is not (a build that stopped, or one running now) is used, its
entries being whole files, but not reported as reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import struct
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hymt_serve import __version__

if TYPE_CHECKING:
    from hymt_serve.core.settings import Settings
    from hymt_serve.engine.checkpoints.loading import LoadedModel

MANIFEST = "manifest.json"
COMPLETE = "complete.json"
LAYOUT = 1  # of the manifest and the folder: a change makes every older folder a mismatch
KEEP = 8  # key folders kept under a root (a work folder may serve several models)
STALE_TEMP_S = 3600.0  # a temporary folder this old is a builder's that died
HEADER_LIMIT = 64 * 1024 * 1024  # a safetensors header past this is not one
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
ENGINE_SOURCE = Path(__file__).resolve().parent  # hymt_serve/engine: the code that compiles
DIR_ENV = "HYMT_COMPILE_CACHE_DIR"  # overrides the compile_cache_dir setting (containers)
WORK_DIR_ENV = "HYMT_WORK_DIR"  # set by `hymt start` for its workers
OFF = "off"


def resolve_root(setting: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The root folder of the compile caches, None when off. ``setting`` is the
    ``compile_cache_dir`` value ("auto", "off" or a folder), overridden by $HYMT_COMPILE_CACHE_DIR.
    "auto" is ``compile-cache`` in the work folder of ``hymt start`` ($HYMT_WORK_DIR), else in
    the user's cache folder ($XDG_CACHE_HOME or ~/.cache, under hymt/). A relative folder is
    read against the work folder."""
    value = environ.get(DIR_ENV, "").strip() or setting
    if value.lower() == OFF:
        return None
    work = environ.get(WORK_DIR_ENV, "").strip()
    if value.lower() == "auto":
        if work:
            return Path(work) / "compile-cache"
        cache_home = environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
        return Path(cache_home) / "hymt" / "compile-cache"
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(work or os.getcwd()) / path


# --- the key ------------------------------------------------------------------------------


def model_identity(folder: Path) -> dict[str, Any]:
    """What compiling sees of a model folder, read cheaply: config.json's hash, and each weight
    file's name and size, with a safetensors file's header (tensor names, dtypes, shapes) hashed
    too. Not the weights' values: compiled code does not depend on them (so a copied folder,
    another mtime, still matches)."""
    config = folder / "config.json"
    files: dict[str, Any] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.suffix in WEIGHT_SUFFIXES or path.name.endswith(".index.json"):
            entry: dict[str, Any] = {"bytes": path.stat().st_size}
            if path.suffix == ".safetensors":
                entry["header"] = _safetensors_header_hash(path)
            elif path.suffix == ".json":
                entry["sha256"] = _file_hash(path)
            files[path.name] = entry
    return {
        "config_sha256": _file_hash(config) if config.is_file() else None,
        "weights": files,
    }


def _safetensors_header_hash(path: Path) -> str | None:
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) < 8:
            return None
        (size,) = struct.unpack("<Q", head)
        if size > HEADER_LIMIT:
            return None
        return hashlib.sha256(file.read(size)).hexdigest()


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hash(folder: Path = ENGINE_SOURCE) -> str:
    """A hash of the engine's Python sources (names and contents), the code that builds what
    is compiled."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def code_identity() -> dict[str, Any]:
    """Our package's version and engine sources, Python's, torch's and Triton's versions."""
    try:
        import triton  # optional: the CPU image has none

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "hymt_serve": __version__,
        "engine_sources": source_hash(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
    }


def card_identity(device: torch.device) -> dict[str, Any]:
    """The device compiled for: a CUDA card's name, compute capability, CUDA and driver
    versions; on the CPU its architecture and the vector instructions inductor targets."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        return {
            "type": "cuda",
            "name": torch.cuda.get_device_name(index),
            "capability": list(torch.cuda.get_device_capability(index)),
            "cuda": torch.version.cuda,
            "driver": _nvidia_driver(),
        }
    return {
        "type": device.type,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def _nvidia_driver(version_file: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    try:
        return version_file.read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError):
        return None


def key_inputs(
    *, model: Mapping[str, Any], card: Mapping[str, Any], precision: Mapping[str, Any],
    engine: Mapping[str, Any], code: Mapping[str, Any],
) -> dict[str, Any]:  # fmt: skip
    """Everything a cache is keyed on, JSON-ready: the manifest's content."""
    return {
        "layout": LAYOUT,
        "model": dict(model),
        "card": dict(card),
        "precision": dict(precision),
        "engine": dict(engine),
        "code": dict(code),
    }


def engine_inputs(settings: Settings, loaded: LoadedModel, quantization: str) -> dict[str, Any]:
    """:func:`key_inputs` of an engine built from ``settings`` over ``loaded``, whose weights
    are ``quantization`` (the setting, or a quantized checkpoint's kind)."""
    model: Any = loaded.model
    device = next(model.parameters()).device
    rows, limits = settings.scheduler, settings.limits
    return key_inputs(
        model=model_identity(settings.model_path),
        card=card_identity(device),
        precision={
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "quantization": quantization,
            "quantize_lm_head": settings.loading.quantize_lm_head,
            "checkpoint_format": loaded.checkpoint_format,
        },
        engine={  # what shapes the compiled steps and graphs
            "engine": settings.loading.engine,
            "max_batch_rows": rows.max_batch_rows,
            "max_seq_len": limits.max_input_tokens + limits.max_new_tokens,
            "prefix_cache_entries": rows.prefix_cache_entries,
            "mixed_step_tokens": rows.mixed_step_tokens,
            "one_row_kernel": settings.loading.one_row_kernel,
            "blas_library": settings.loading.blas_library,
        },
        code=code_identity(),
    )


def cache_key(inputs: Mapping[str, Any]) -> str:
    """The folder name of ``inputs``: a hash of their canonical JSON."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


# --- the folder ---------------------------------------------------------------------------


@dataclass
class CompileCache:
    """One key's folder, opened: where torch's caches go, and whether it held a finished
    build's results (``reused``) or why not."""

    dir: Path
    reused: bool
    why_not: str | None
    files_before: int = 0
    counters_before: dict[str, int] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def inductor_dir(self) -> Path:
        return self.dir / "inductor"

    @property
    def triton_dir(self) -> Path:
        return self.dir / "triton"

    def apply(self, environ: Any = os.environ) -> None:
        """Point inductor's and Triton's caches here (both read these at each use)."""
        environ["TORCHINDUCTOR_CACHE_DIR"] = str(self.inductor_dir)
        environ["TRITON_CACHE_DIR"] = str(self.triton_dir)
        self.files_before = _count_files(self.dir)
        self.counters_before = inductor_counters()

    def finish(self) -> dict[str, Any]:
        """Mark the folder complete (a build finished on it) and return :meth:`describe`."""
        after = inductor_counters()
        files = _count_files(self.dir)
        self.report = {
            "fx_graph_hits": after["hits"] - self.counters_before.get("hits", 0),
            "fx_graph_misses": after["misses"] - self.counters_before.get("misses", 0),
            "files_found": self.files_before,
            "files_added": max(0, files - self.files_before),
        }
        _write_atomic(self.dir / COMPLETE, {**self.report, "finished_at": time.time()})
        return self.describe()

    def describe(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "reused": self.reused, "why_not": self.why_not, **self.report}


def inductor_counters() -> dict[str, int]:
    """Inductor's FX graph cache hits and misses in this process so far."""
    from torch._dynamo.utils import counters  # torch._dynamo: loaded when compiling, not before

    inductor = counters["inductor"]
    return {"hits": inductor["fxgraph_cache_hit"], "misses": inductor["fxgraph_cache_miss"]}


def open_cache(root: Path, inputs: Mapping[str, Any], keep: int = KEEP) -> CompileCache:
    """The folder of ``inputs`` under ``root``: made when missing, replaced when its manifest
    differs (never trusted), reused when a build finished on it. Folders of other keys beyond
    the ``keep`` most recently used are removed."""
    root.mkdir(parents=True, exist_ok=True)
    wanted = json.loads(json.dumps(inputs))  # as the manifest reads back (lists, not tuples)
    final = root / cache_key(inputs)
    why_not: str | None = None
    found = _read_manifest(final)
    if found is not None and found != wanted:
        differs = sorted(k for k in set(found) | set(wanted) if found.get(k) != wanted.get(k))
        why_not = f"the folder's manifest differs ({', '.join(differs)}): set aside, made anew"
        _remove(final)
        found = None
    elif final.exists() and found is None:
        why_not = "the folder had no readable manifest: set aside, made anew"
        _remove(final)
    if found is None:
        _make(root, final, wanted)
        if _read_manifest(final) != wanted:  # (another builder's rename won with other inputs)
            raise RuntimeError(f"compile cache {final}: its manifest changed while opening")
        why_not = why_not or "no cache for this model, card, precision and code yet"
        reused = False
    elif not (final / COMPLETE).is_file():
        why_not = "the cache is incomplete (a build stopped, or another is building now)"
        reused = False
    else:
        reused = True
    os.utime(final)  # most recently used: pruned last
    _prune(root, keep, final)
    return CompileCache(final, reused, None if reused else why_not)


def _read_manifest(folder: Path) -> Any:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _make(root: Path, final: Path, inputs: Any) -> None:
    """``final`` with its manifest, made under a temporary name and renamed into place: a
    concurrent builder's rename may win, and then its folder (same inputs) is used."""
    temp = Path(tempfile.mkdtemp(prefix=f".new-{final.name}-", dir=root))
    _write_atomic(temp / MANIFEST, inputs)
    try:
        temp.rename(final)
    except OSError:  # final exists: another builder made it first
        shutil.rmtree(temp, ignore_errors=True)


def _write_atomic(path: Path, content: Any) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(content, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temp, path)


def _remove(folder: Path) -> None:
    """Rename ``folder`` aside first (so that no one opens it half removed), then remove it."""
    aside = folder.with_name(f".old-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        folder.rename(aside)
    except FileNotFoundError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def _prune(root: Path, keep: int, current: Path) -> None:
    now = time.time()
    folders = []
    for path in root.iterdir():
        if not path.is_dir() or path == current:
            continue
        if path.name.startswith("."):  # a builder's temporary folder, or one set aside
            if now - path.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(path, ignore_errors=True)
            continue
        folders.append(path)
    folders.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in folders[max(0, keep - 1) :]:
        _remove(old)


def _count_files(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))
