"""Load a bench/ script as a module for a unit test (bench/ is not a package; its scripts import each other)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench_module(filename: str, name: str) -> ModuleType:
    """``bench/<filename>`` executed as module ``name`` (registered in ``sys.modules``: dataclasses look it up)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / filename)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))
