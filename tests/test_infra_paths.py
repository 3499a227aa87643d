"""infra.paths: a checkout keeps its cache in .cache/; an installed package never writes into
site-packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import paths

REPO = Path(__file__).resolve().parents[1]


def test_a_checkout_keeps_its_cache_beside_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(paths.CACHE_ENV_VAR, raising=False)
    assert paths.PACKAGE_ROOT == REPO and paths.CHECKOUT
    assert paths.cache_dir() == REPO / ".cache"


def test_installed_the_cache_is_the_users(monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Path) -> None:
    monkeypatch.delenv(paths.CACHE_ENV_VAR, raising=False)
    monkeypatch.setattr(paths, "CHECKOUT", False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "xdg" / "swarmload"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "swarmload"
    monkeypatch.setenv(paths.CACHE_ENV_VAR, str(tmp_path / "mine"))
    assert paths.cache_dir() == tmp_path / "mine"
