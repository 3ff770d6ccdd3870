"""The package under test is the installed wheel (CI sets MWS_EXPECT_INSTALLED_WHEEL=1):
its native library is the one inside the package, found without MWS_LIBRARY, and
no repository checkout is importable. Elsewhere (a source checkout) the loader's
fallbacks are checked instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mooncake_weight_store as mws
from mooncake_weight_store import _lib

PKG = Path(mws.__file__).resolve().parent


def test_library_comes_from_the_package_when_installed():
    lib = Path(mws.library_path()).resolve()
    if os.environ.get("MWS_EXPECT_INSTALLED_WHEEL") == "1":
        assert "MWS_LIBRARY" not in os.environ
        assert lib.parent == PKG and lib.name.startswith("libmooncake_weight_store"), lib
        assert "site-packages" in PKG.parts, PKG
        assert not any((Path(p or ".").resolve() / "Cargo.toml").is_file() for p in sys.path), sys.path
        assert _lib.packaged_libraries() == [str(lib)]
    else:
        assert lib.is_file()


def test_mws_library_still_overrides_the_packaged_library(tmp_path):
    """MWS_LIBRARY wins over the packaged library (and a wrong one fails loudly)."""
    code = "import mooncake_weight_store as m; print(m.library_path())"
    env = dict(os.environ, MWS_LIBRARY=mws.library_path())
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == mws.library_path()
    env["MWS_LIBRARY"] = str(tmp_path / "nope.so")
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "cannot load libmooncake_weight_store" in bad.stderr
