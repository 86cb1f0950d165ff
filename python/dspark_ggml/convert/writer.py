"""Streaming, atomic GGUF output.

The gguf package's writer lays out the header, metadata and tensor table from the plan (shapes
and types are known before any data is read); the tensor data is then streamed block by block
into the same file. Everything goes to a temporary file next to the destination, which is renamed
over it only after the last byte is flushed and synced, so an error or Ctrl-C never leaves a
half-written GGUF behind.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import GGUFWriter
from tqdm import tqdm

from . import gguf_keys as K
from .errors import ConversionError
from .plan import ModelPlan, PlannedTensor
from .quant import encode

# f32 bytes per block read from the checkpoint; bounds the converter's working memory
BLOCK_BYTES = 64 << 20


def check_destination(out_path: Path, force: bool) -> None:
    if out_path.is_dir():
        raise ConversionError(f"{out_path} is a directory; give the output file name")
    if out_path.exists() and not force:
        raise ConversionError(f"{out_path} already exists; pass --force to overwrite it")
    if not out_path.parent.is_dir():
        raise ConversionError(f"{out_path.parent}: no such directory")


def _temporary_path(out_path: Path) -> Path:
    return out_path.with_name(f".{out_path.name}.{os.getpid()}.partial")


def _prepare_writer(plan: ModelPlan, path: Path) -> GGUFWriter:
    writer = GGUFWriter(path=None, arch=plan.arch)  # adds general.architecture itself
    for key, kv in plan.kv.items():
        if key != K.ARCHITECTURE:
            writer.add_key_value(key, kv.value, kv.type, sub_type=kv.item_type)
    for t in plan.tensors:
        # the dtype argument only matters for uint8 byte shapes; we give element shapes
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    writer.write_header_to_file(path=path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    return writer


def _stream_tensor(t: PlannedTensor, fout: BinaryIO, writer: GGUFWriter, bar: tqdm) -> None:
    written = 0
    for block in t.source.blocks(BLOCK_BYTES):
        data = encode(block, t.qtype)
        data.tofile(fout)
        written += data.nbytes
        bar.update(data.nbytes)
    if written != t.nbytes:
        raise AssertionError(f"{t.name}: wrote {written} bytes, planned {t.nbytes}")
    writer.write_padding(fout, written)


def _write_data(plan: ModelPlan, writer: GGUFWriter, progress: bool) -> None:
    assert writer.fout is not None and len(writer.fout) == 1
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())  # tensor data starts aligned
    total = sum(t.nbytes for t in plan.tensors)
    with tqdm(total=total, unit="B", unit_scale=True, desc="Writing",
              disable=not progress) as bar:
        for t in plan.tensors:
            bar.set_postfix_str(t.name, refresh=False)
            _stream_tensor(t, fout, writer, bar)
    fout.flush()
    os.fsync(fout.fileno())


def write_gguf(plan: ModelPlan, out_path: Path, *, force: bool, progress: bool) -> Path:
    check_destination(out_path, force)
    tmp = _temporary_path(out_path)
    writer = None
    try:
        writer = _prepare_writer(plan, tmp)
        _write_data(plan, writer, progress)
        writer.close()
        os.replace(tmp, out_path)
    except BaseException:  # also KeyboardInterrupt: never leave the partial file around
        if writer is not None:
            writer.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return out_path
