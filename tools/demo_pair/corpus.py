"""Corpus for the demo pair: the Python standard library's own source files.

Selection (exact rule, applied to ``sysconfig.get_paths()["stdlib"]``):

* every regular file whose name ends in ``.py``, found by ``os.walk`` (symlinks not followed);
* excluding any file whose path relative to the stdlib root has a first component in
  ``EXCLUDED_TOP`` (``site-packages``, ``dist-packages``, ``test``, ``encodings`` (codec tables),
  ``pydoc_data`` (one 750 KB string literal), ``turtledemo``, ``lib2to3`` (grammar tables and fixers) );
* excluding any file with a path component ``test``, ``tests`` or ``idle_test`` (test suites);
* excluding files that are not valid UTF-8 or are smaller than 200 bytes or larger than 300 KB.

Files are sorted by their POSIX relative path (byte order) so the result does not depend on the
file system's directory order.

Split: a file is HELD OUT when ``int(sha1(relpath).hexdigest(), 16) % 20 == 0`` (about 5 % of the
files), otherwise it is TRAIN. The split depends only on the relative path, so it is the same on every
machine that has the same Python version. The prompts used for evaluation come only from held-out
files.

Documents are the file texts with Windows line ends normalised to "\\n"; each document is prefixed
by a one-line header ``# file: <relpath>\\n`` so the model sees which module it is in.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

EXCLUDED_TOP = {"site-packages", "dist-packages", "test", "encodings", "pydoc_data", "turtledemo", "lib2to3"}
EXCLUDED_ANY = {"test", "tests", "idle_test", "__pycache__"}
MIN_BYTES = 200
MAX_BYTES = 300_000
HELDOUT_MOD = 20


@dataclass(frozen=True)
class Doc:
    relpath: str
    text: str
    heldout: bool


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def is_heldout(relpath: str) -> bool:
    return int(hashlib.sha1(relpath.encode("utf-8")).hexdigest(), 16) % HELDOUT_MOD == 0


def list_files(root: str | None = None) -> list[str]:
    root = root or stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        if parts and parts[0] in EXCLUDED_TOP:
            dirnames[:] = []
            continue
        if any(p in EXCLUDED_ANY for p in parts):
            dirnames[:] = []
            continue
        for fn in filenames:
            if not fn.endswith(".py"):
                continue
            full = os.path.join(dirpath, fn)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            size = os.path.getsize(full)
            if size < MIN_BYTES or size > MAX_BYTES:
                continue
            out.append("/".join(parts + [fn]))
    out.sort(key=lambda s: s.encode("utf-8"))
    return out


def load_docs(root: str | None = None) -> list[Doc]:
    root = root or stdlib_root()
    docs = []
    for rel in list_files(root):
        with open(os.path.join(root, *rel.split("/")), "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        docs.append(Doc(rel, f"# file: {rel}\n" + text, is_heldout(rel)))
    return docs


def split(docs: list[Doc]) -> tuple[list[Doc], list[Doc]]:
    return [d for d in docs if not d.heldout], [d for d in docs if d.heldout]


if __name__ == "__main__":
    import sys

    docs = load_docs()
    tr, ho = split(docs)
    print(f"stdlib: {stdlib_root()}  (Python {sys.version.split()[0]})")
    print(f"train: {len(tr)} files, {sum(len(d.text) for d in tr)} chars")
    print(f"held-out: {len(ho)} files, {sum(len(d.text) for d in ho)} chars")
    if "-v" in sys.argv:
        for d in ho:
            print("  held-out:", d.relpath)


# --------------------------------------------------------------------------------------------------
# Chat-formatted samples (so the ChatML template means something to the model).
#
# From every TRAIN file that parses with ``ast``: each function or method that has a docstring and
# whose (dedented) source is 120..1500 characters long becomes one conversation
#   <|im_start|>user\nWrite a Python function `NAME`: FIRST DOCSTRING LINE<|im_end|>\n
#   <|im_start|>assistant\nSOURCE<|im_end|>\n
# in file order then source order. Held-out files are never used.
# --------------------------------------------------------------------------------------------------

CHAT_MIN_CHARS = 120
CHAT_MAX_CHARS = 1500


def chat_samples(docs: list[Doc]) -> list[str]:
    import ast
    import textwrap

    out = []
    for d in docs:
        if d.heldout:
            continue
        src = d.text.split("\n", 1)[1]
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.split("\n")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            summary = doc.strip().split("\n", 1)[0].strip()
            if not summary:
                continue
            if node.end_lineno is None:
                continue
            # the function's full lines (decorators excluded), dedented
            seg = textwrap.dedent("\n".join(lines[node.lineno - 1:node.end_lineno]))
            if not (CHAT_MIN_CHARS <= len(seg) <= CHAT_MAX_CHARS):
                continue
            out.append(
                f"<|im_start|>user\nWrite a Python function `{node.name}`: {summary}<|im_end|>\n"
                f"<|im_start|>assistant\n{seg}<|im_end|>\n"
            )
    return out
