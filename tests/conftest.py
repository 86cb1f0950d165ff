"""Shared fixtures: tiny random models written per test session (fixed seeds, no downloads)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `tests.reference` is importable from any working directory
    sys.path.insert(0, str(ROOT))

from tests.tiny_models import DraftConfig, TargetConfig, write_draft, write_target  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def make_target(model_dir: Path) -> Callable[..., tuple[Path, dict, TargetConfig]]:
    """make_target(name, **TargetConfig fields) -> (path, float32 weights, config); cached by name."""
    cache: dict[str, tuple[Path, dict, TargetConfig]] = {}

    def make(name: str, seed: int = 0, **fields: object) -> tuple[Path, dict, TargetConfig]:
        if name not in cache:
            cfg = TargetConfig(**fields)  # type: ignore[arg-type]
            path = model_dir / f"{name}.gguf"
            weights = write_target(path, cfg, seed=seed)
            cache[name] = (path, weights, cfg)
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_pair(model_dir: Path) -> tuple[str, str]:
    """(target, draft): the default tiny target (with a tokenizer) and a DSpark draft for it."""
    tcfg = TargetConfig()
    write_target(model_dir / "pair_target.gguf", tcfg, seed=0)
    write_draft(model_dir / "pair_draft.gguf", DraftConfig(), tcfg, seed=1)
    return str(model_dir / "pair_target.gguf"), str(model_dir / "pair_draft.gguf")


# ---- devices -------------------------------------------------------------------------------------

def _accelerators() -> list:
    """Every non-CPU device of this build (Vulkan, CUDA, Metal, ...), in registry order."""
    from dspark_ggml.system import devices

    return [d for d in devices() if d.type != "cpu"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "device: compares a non-CPU device with the CPU (tests/test_devices.py)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes `accel` runs once per non-CPU device and is skipped where there is none."""
    if "accel" not in metafunc.fixturenames:
        return
    devs = _accelerators()
    if devs:
        metafunc.parametrize("accel", devs, ids=[d.name for d in devs])
    else:
        metafunc.parametrize("accel", [pytest.param(None, marks=pytest.mark.skip(reason="no non-CPU device"))],
                             ids=["no-device"])
