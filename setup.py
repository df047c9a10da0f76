"""Build hook (the project's metadata is in pyproject.toml): a built copy of the package names the commit it was built
from, in suite/run/_version_stamp.py (suite.run.install_stamp), since an installed copy has no checkout to ask. An
editable install is left alone: git names the version of its checkout."""
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # the source tree's suite: nothing is installed while the package builds



def stamp(package_dir: Path) -> None:
    """Stamp the built copy; a build never fails for want of a stamp (the copy then names no version)."""
    try:  # standard library only (tests/test_install_stamp.py), but an isolated build must not depend on it
        from suite.run.device import git_commit
        from suite.run.install_stamp import write_stamp
    except ImportError as exc:
        print(f"setup.py: the built copy names no code version ({exc})", file=sys.stderr)
        return
    write_stamp(package_dir / "suite" / "run", git_commit(ROOT))


class StampedBuildPy(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            stamp(Path(self.build_lib))


class StampedSdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        stamp(Path(base_dir))


setup(cmdclass={"build_py": StampedBuildPy, "sdist": StampedSdist})
