"""Builds the wheel: the pure-Python package plus ``libmooncake_weight_store`` (the
C ABI crate ``capi/`` of the repository's Cargo workspace, built by cargo through
setuptools-rust).

The crate is found at ``../capi/Cargo.toml``: build from a repository checkout
(``pip install ./python``, ``pip wheel ./python``; pip builds in place). The wheel is
tagged ``py3-none-<platform>``: the library is loaded with ctypes and does not link
against Python, so one wheel serves every CPython >= 3.9 on that platform.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup
from setuptools_rust import Binding, RustExtension, Strip

try:  # setuptools >= 70.1
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - older setuptools
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
CRATE = HERE.parent / "capi" / "Cargo.toml"

if not CRATE.is_file():
    raise SystemExit(
        f"mooncake-weight-store: the Rust crate was not found at {CRATE}. Build the wheel from a "
        "repository checkout (`pip install ./python` or `pip wheel ./python` from the repository root); "
        "an sdist alone does not carry the crate."
    )


class bdist_wheel_py3_none(bdist_wheel):
    """``py3-none-<platform>``: the native library is not a CPython extension."""

    def get_tag(self):  # type: ignore[no-untyped-def]
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    rust_extensions=[
        RustExtension(
            # -> mooncake_weight_store/libmooncake_weight_store.abi3.so (found by _lib.py)
            "mooncake_weight_store.libmooncake_weight_store",
            path=str(CRATE),
            binding=Binding.NoBinding,
            py_limited_api=True,
            strip=Strip.Debug,
            args=["--locked"] if os.environ.get("MWS_CARGO_LOCKED", "1") == "1" else [],
        )
    ],
    cmdclass={"bdist_wheel": bdist_wheel_py3_none},
    zip_safe=False,
)
