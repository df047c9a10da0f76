"""The code version of an installed copy: stamped when the package is built, read when no checkout names it.

Records name their code version with `suite.run.device.git_commit`, which asks git about the checkout the package
was imported from. A copy installed from a wheel or an sdist (`pip install .`, a copy on a GPU machine) has no
checkout, so the build (`setup.py`) writes the commit of the tree it was built from into the built package as
`suite/run/_version_stamp.py`, marked `+installed`: `<sha>+installed`, or `<sha>+installed+dirty` when the built
tree had uncommitted code (`+dirty` stays last, where the report looks for it). An sdist carries the stamp of its
tree, so a wheel built from it keeps it. A checkout and an editable install never hold the file (it is git-ignored,
and the build does not write it for an editable install): git names their version.

Standard library only: the build imports this module from the source tree, where nothing is installed yet.
"""
from __future__ import annotations

import importlib
from pathlib import Path

STAMP_MODULE = "_version_stamp"  # suite/run/_version_stamp.py, in built copies only
MARK = "+installed"


def stamped(commit: str) -> str:
    """git_commit's value for a tree, as an installed copy names it: the mark after the commit (and `+shallow`), before
    `+dirty`."""
    dirty = commit.endswith("+dirty")
    return commit.removesuffix("+dirty") + MARK + ("+dirty" if dirty else "")


def installed_commit() -> str | None:
    """The version stamped into this copy when it was built, or None (a checkout, an editable install, or a copy built
    without git)."""
    try:
        return importlib.import_module(f"suite.run.{STAMP_MODULE}").COMMIT
    except (ImportError, AttributeError):
        return None


def write_stamp(package_dir: Path, commit: str | None) -> str | None:
    """Write `package_dir/_version_stamp.py` naming `commit` (git_commit of the tree being built) as an installed copy
    names it, and return that. Without a commit (an unpacked sdist has no checkout) nothing is written: a stamp the
    sdist carries is kept."""
    if commit is None:
        return None
    version = stamped(commit)
    path = Path(package_dir) / f"{STAMP_MODULE}.py"
    path.unlink(missing_ok=True)  # an sdist's release tree hard-links its files to the source's: never write through
    path.write_text('"""Written by the build (suite.run.install_stamp): the code version this copy was built from."""\n'
                    f"COMMIT = {version!r}\n")
    return version
