"""The wheel ships every file of the tree that it should, at its import path.

``[tool.setuptools] packages`` is an explicit list (``packages.find`` leaves out the folders
``package-dir`` maps, such as ``migrations/alembic``), so a new package folder must be
added to it by hand: these tests compute what the wheel should hold from the tree
(every ``.py``, ``.pyi`` and package-data file under ``outbox/``, ``broker_embedded/`` and
``migrations/``, at its mapped import path) and name what to add when it does not.
"""

from __future__ import annotations

import fnmatch
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tests.wheelhouse import built_wheel

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
#: The folders the wheel is made from; each import name installs from its folder.
SOURCES = {"outbox": "outbox", "broker_embedded": "broker_embedded", **SETUPTOOLS["package-dir"]}
#: The checkout's folder of migration histories (every subfolder needs a package-dir
#: mapping) and its own ``__init__.py``, which only serves the type checker.
MIGRATIONS = "migrations"
NOT_SHIPPED = {"migrations/__init__.py"}
PACKAGE_DATA = SETUPTOOLS["package-data"]["*"]
WHERE = "[tool.setuptools] packages in pyproject.toml"


def _shipped(name: str) -> bool:
    return name.endswith((".py", ".pyi")) or any(fnmatch.fnmatch(name, p) for p in PACKAGE_DATA)


def _import_path(source: PurePosixPath) -> PurePosixPath | None:
    """Where the checkout's file ``source`` installs (None: under no mapped folder)."""
    folders = sorted(SOURCES.items(), key=lambda item: len(item[1]), reverse=True)
    for package, folder in folders:
        if source.is_relative_to(folder):
            return PurePosixPath(*package.split(".")) / source.relative_to(folder)
    return None


def expected_files() -> dict[str, str]:
    """The wheel's files (import paths) computed from the tree, each with its source path."""
    expected: dict[str, str] = {}
    unmapped: list[str] = []
    for top in ("outbox", "broker_embedded", MIGRATIONS):
        for path in sorted((ROOT / top).rglob("*")):
            source = PurePosixPath(path.relative_to(ROOT).as_posix())
            if not path.is_file() or "__pycache__" in source.parts or not _shipped(path.name):
                continue
            if str(source) in NOT_SHIPPED:
                continue
            target = _import_path(source)
            if target is None:
                unmapped.append(str(source))
            else:
                expected[str(target)] = str(source)
    assert not unmapped, (f"{unmapped} are under {MIGRATIONS}/ but no [tool.setuptools.package-dir] "
                          "entry in pyproject.toml maps their folder to an import name")
    return expected


def test_the_package_list_is_every_folder_with_a_shipped_file() -> None:
    needed = {str(PurePosixPath(target).parent).replace("/", ".") for target in expected_files()}
    listed = set(SETUPTOOLS["packages"])
    assert not needed - listed, f"add {sorted(needed - listed)} to {WHERE}"
    assert not listed - needed, f"remove {sorted(listed - needed)} from {WHERE} (no shipped file there)"


def test_no_folder_in_the_tree_shadows_a_mapped_package() -> None:
    """A folder at a mapped package's own path (``outbox/integrations/alembic/``, say one
    with only a ``__pycache__`` left from before the move) is imported in place of it."""
    shadows = [f"{path.relative_to(ROOT)} (the package's files are in {folder})"
               for package, folder in SETUPTOOLS["package-dir"].items()
               if (path := ROOT.joinpath(*package.split("."))).exists()]
    assert not shadows, f"delete {shadows}: each is imported in place of the mapped package"


@pytest.mark.slow
def test_the_built_wheel_holds_exactly_the_trees_files() -> None:
    with zipfile.ZipFile(built_wheel()) as wheel:
        names = {name for name in wheel.namelist() if ".dist-info/" not in name}
    expected = expected_files()
    missing = sorted(f"{expected[name]} (as {name})" for name in set(expected) - names)
    assert not missing, f"the wheel lacks {missing}: is its folder in {WHERE}?"
    assert names == set(expected), f"the wheel has files the tree does not ship: {sorted(names - set(expected))}"
