"""Our GGUFs against llama.cpp's convert_hf_to_gguf.py on the same tiny checkpoints.

For every format and outtype the two files must hold the same metadata (keys, types, values),
the same tensors (names, types, shapes) and the same bytes, except for the differences listed in
each case, which are deliberate (see `dspark_ggml.convert.convert`).

llama.cpp's converter comes from the cached llama-cpp-python sdist (third_party/llama_cpp_sdist.py,
no network; extracted into that cache's tree) and runs in one subprocess for all cases (it needs
torch and transformers).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

import hf_checkpoints as hf
from dspark_ggml.convert import convert

REPO = Path(__file__).resolve().parents[1]

# Values that describe the file rather than the model: llama.cpp derives a display name from the
# directory (and a model card) and counts the parameters of what it writes; ours differ.
PROVENANCE_KEYS = frozenset({"general.name", "general.size_label"})


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # key into the checkpoints built below
    outtype: str
    pre: str  # tokenizer.ggml.pre the fixture tokenizer stands for (see the wrapper below)
    target: Optional[str] = None
    overrides: dict = field(default_factory=dict)
    # deliberate differences
    ours_only_keys: frozenset = frozenset()
    llama_cpp_only_tensors: frozenset = frozenset()
    # llama.cpp reads this checkpoint's config.json as written (see the wrapper below)
    raw_config: bool = False


DSPARK_KEYS = frozenset({"dflash.markov_head_type"})  # our addition for every DSpark draft
SHARED_EMBEDDING = frozenset({"token_embd.weight"})  # equal to the target's: we share it
# a Gemma-4 DeepSpec draft copies the target's (tied) embedding as embedding and as lm head
SHARED_EMBEDDING_AND_HEAD = frozenset({"token_embd.weight", "output.weight"})
GEMMA = "default"  # the gemma4 tokenizer model has no pre-tokenizer name

CASES = [
    Case("qwen3_q8_0", "qwen3", "q8_0", "qwen2"),
    Case("qwen2_bf16", "qwen2", "bf16", "qwen2"),
    Case("llama_f16", "llama", "f16", "llama-bpe"),
    Case("llama_q8_0", "llama", "q8_0", "llama-bpe"),
    Case("deepspec_f16", "deepspec", "f16", "qwen2", target="qwen3",
         ours_only_keys=DSPARK_KEYS, llama_cpp_only_tensors=SHARED_EMBEDDING),
    Case("deepspec_dflash_f32", "deepspec_dflash", "f32", "qwen2", target="qwen3",
         llama_cpp_only_tensors=SHARED_EMBEDDING),
    Case("speculators_reduced_q8_0", "spec_reduced", "q8_0", "qwen2", target="qwen3",
         ours_only_keys=DSPARK_KEYS, llama_cpp_only_tensors=SHARED_EMBEDDING),
    Case("speculators_bonus_anchor_f16", "spec_bonus", "f16", "qwen2", target="qwen3",
         ours_only_keys=DSPARK_KEYS, llama_cpp_only_tensors=SHARED_EMBEDDING),
    # SpecForge states no block layout: we need the flag; llama.cpp assumes anchor-first
    Case("specforge_bf16", "specforge", "bf16", "qwen2", target="qwen3",
         overrides={"sample_from_anchor": True}, ours_only_keys=DSPARK_KEYS),
    # llama.cpp writes neither key for plain DFlash; we always state the layout explicitly
    Case("zlab_f32", "zlab", "f32", "qwen2", target="qwen3",
         ours_only_keys=frozenset({"dflash.sample_from_anchor", "dflash.has_confidence_head"})),
    Case("qwen3moe_f16", "qwen3moe", "f16", "qwen2"),
    Case("qwen3moe_q8_0", "qwen3moe", "q8_0", "qwen2"),
    Case("gemma4_dense_f32", "gemma4_dense", "f32", GEMMA),
    Case("gemma4_dense_q8_0", "gemma4_dense", "q8_0", GEMMA),
    Case("gemma4_ple_f16", "gemma4_ple", "f16", GEMMA),
    Case("gemma4_moe_q8_0", "gemma4_moe", "q8_0", GEMMA),
    Case("gemma4_moe_bf16", "gemma4_moe", "bf16", GEMMA),
    Case("gemma4_conditional_bf16", "gemma4_conditional", "bf16", GEMMA),
    Case("gemma4_dspark_f16", "gemma4_dspark", "f16", GEMMA, target="gemma4_dense",
         ours_only_keys=DSPARK_KEYS, llama_cpp_only_tensors=SHARED_EMBEDDING_AND_HEAD,
         raw_config=True),
    Case("gemma4_dspark_conditional_q8_0", "gemma4_dspark_conditional", "q8_0", GEMMA,
         target="gemma4_conditional", ours_only_keys=DSPARK_KEYS,
         llama_cpp_only_tensors=SHARED_EMBEDDING_AND_HEAD, raw_config=True),
    # llama.cpp's converter cannot map Gemma-4 layers of a speculators draft (it reads them as
    # Qwen3 layers): those drafts are checked in test_convert.py only
]


def _build_checkpoints(root: Path) -> dict[str, Path]:
    base = hf.make_base_checkpoints(root)
    qwen3 = base["qwen3"]
    return {
        **base,
        "deepspec_dflash": hf.make_deepspec_dspark(root / "deepspec_dflash", qwen3, head_type=None),
        "spec_reduced": hf.make_speculators_dspark(root / "spec_reduced", qwen3, draft_vocab_size=96),
        "spec_bonus": hf.make_speculators_dspark(root / "spec_bonus", qwen3, sample_from_anchor=False),
        "specforge": hf.make_specforge_dspark(root / "specforge", qwen3),
        "zlab": hf.make_zlab_dflash(root / "zlab", qwen3),
        "qwen3moe": hf.make_qwen3moe_target(root / "qwen3moe"),
        **_gemma4_checkpoints(root),
    }


def _gemma4_checkpoints(root: Path) -> dict[str, Path]:
    models = {f"gemma4_{v}": hf.make_gemma4_target(root / f"gemma4_{v}", v)
              for v in hf.GEMMA4_VARIANTS}
    models["gemma4_conditional"] = hf.make_gemma4_conditional_target(root / "gemma4_conditional")
    models["gemma4_dspark"] = hf.make_gemma4_dspark(root / "gemma4_dspark",
                                                    models["gemma4_dense"])
    models["gemma4_dspark_conditional"] = hf.make_gemma4_dspark(
        root / "gemma4_dspark_conditional", models["gemma4_conditional"])
    return models


# ----------------------------------------------------------------------------------------------
# llama.cpp's converter


def _sdist_module():
    spec = importlib.util.spec_from_file_location("llama_cpp_sdist",
                                                  REPO / "third_party" / "llama_cpp_sdist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _extract_llama_cpp_converter() -> Path:
    """The converter's files, extracted once into the sdist cache's own tree (reading the
    compressed archive takes seconds per member group, so it is not redone per test run)."""
    sdist = _sdist_module()
    archive = sdist.cache_dir() / sdist.ARCHIVE
    if not archive.is_file():
        pytest.fail(f"llama.cpp reference converter unavailable: {archive} is missing. It is "
                    "cached by the build (or `python third_party/llama_cpp_sdist.py archive`, "
                    "which needs the network once); this test does not download it.")
    dest = sdist.cache_dir() / "tree"
    for prefix in ("convert_hf_to_gguf.py", "conversion", "gguf-py"):
        sdist.extract(prefix, dest)
    return dest


# Runs llama.cpp's converter once per job in a single process (imports dominate its run time).
# Three patches, none about the conversion itself:
# * llama.cpp names the pre-tokenizer by hashing a sample tokenization, which only works for
#   published tokenizers; the job says which published family the fixture stands for.
# * llama.cpp tries a SentencePiece tokenizer.model first and expects FileNotFoundError when
#   there is none; without the sentencepiece package installed it would fail on the import.
# * llama.cpp loads configs through transformers' AutoConfig. Its Gemma-4 DSpark converter reads
#   `global_head_dim`, which the installed transformers folds into `per_layer_config` on load
#   (the transformers DeepSpec pins kept it); for the jobs that say so, config.json is read as
#   written instead.
_WRAPPER = textwrap.dedent("""
    import json, runpy, sys
    tree = sys.argv[1]
    sys.path[:0] = [tree + "/gguf-py", tree]
    from conversion import base
    state = {}
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: state["pre"]
    def no_sentencepiece(self, *args, **kwargs):
        raise FileNotFoundError("no tokenizer.model")
    base.TextModel._set_vocab_sentencepiece = no_sentencepiece
    load_hparams = base.ModelBase.load_hparams
    def config_as_written(dir_model, is_mistral_format):
        if str(dir_model) in state["raw_config"]:
            with open(f"{dir_model}/config.json", encoding="utf-8") as f:
                return json.load(f)
        return load_hparams(dir_model, is_mistral_format)
    base.ModelBase.load_hparams = staticmethod(config_as_written)
    converter = runpy.run_path(tree + "/convert_hf_to_gguf.py", run_name="llama_cpp_convert")
    for job in json.loads(sys.argv[2]):
        state["pre"] = job["pre"]
        state["raw_config"] = job["raw_config"]
        sys.argv = ["convert_hf_to_gguf.py", *job["args"]]
        converter["main"]()
""")


def _run_llama_cpp(tree: Path, jobs: list[dict], workdir: Path) -> None:
    wrapper = workdir / "run_llama_cpp_converter.py"
    wrapper.write_text(_WRAPPER)
    proc = subprocess.run([sys.executable, str(wrapper), str(tree), json.dumps(jobs)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"llama.cpp's converter failed:\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("interop")
    tree = _extract_llama_cpp_converter()
    models = _build_checkpoints(root / "hf")
    out, jobs, pairs = root / "gguf", [], {}
    out.mkdir()
    for case in CASES:
        ours, theirs = out / f"{case.name}.ours.gguf", out / f"{case.name}.llama_cpp.gguf"
        target = models[case.target] if case.target else None
        convert(models[case.model], ours, outtype=case.outtype, target_model_dir=target,
                progress=False, **case.overrides)
        args = [str(models[case.model]), "--outfile", str(theirs), "--outtype", case.outtype]
        if target:
            args += ["--target-model-dir", str(target)]
        raw = [str(models[case.model])] if case.raw_config else []
        jobs.append({"pre": case.pre, "args": args, "raw_config": raw})
        pairs[case.name] = (ours, theirs)
    _run_llama_cpp(tree, jobs, root)
    return pairs


# ----------------------------------------------------------------------------------------------
# comparison


def _metadata(reader: GGUFReader) -> dict[str, tuple]:
    out = {}
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        value = f.contents()
        out[f.name] = (tuple(GGUFValueType(t) for t in f.types),
                       list(value) if f.types[0] == GGUFValueType.ARRAY else value)
    return out


def _tensors(reader: GGUFReader) -> dict[str, tuple]:
    return {t.name: (t.tensor_type, tuple(int(x) for x in t.shape), np.asarray(t.data))
            for t in reader.tensors}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_same_gguf_as_llama_cpp(converted, case):
    ours_path, theirs_path = converted[case.name]
    ours_reader, theirs_reader = GGUFReader(ours_path), GGUFReader(theirs_path)
    ours, theirs = _metadata(ours_reader), _metadata(theirs_reader)

    assert set(ours) - set(theirs) == set(case.ours_only_keys)
    assert set(theirs) - set(ours) == set()
    for key in sorted(set(ours) & set(theirs) - PROVENANCE_KEYS):
        assert ours[key] == theirs[key], key

    ours_t, theirs_t = _tensors(ours_reader), _tensors(theirs_reader)
    assert set(theirs_t) - set(ours_t) == set(case.llama_cpp_only_tensors)
    assert set(ours_t) - set(theirs_t) == set()
    for name in sorted(ours_t):
        (o_type, o_shape, o_data), (t_type, t_shape, t_data) = ours_t[name], theirs_t[name]
        assert (o_type.name, o_shape) == (t_type.name, t_shape), name
        assert o_data.tobytes() == t_data.tobytes(), name


def test_cases_cover_every_format_and_outtype():
    formats = {c.model for c in CASES}
    assert {"qwen3", "qwen2", "llama", "deepspec", "spec_reduced", "specforge", "zlab", "qwen3moe",
            "gemma4_dense", "gemma4_ple", "gemma4_moe", "gemma4_conditional",
            "gemma4_dspark"} <= formats
    assert {c.outtype for c in CASES} == {"f32", "f16", "bf16", "q8_0"}
