"""The method registry: selection, errors that list valid names, and plugins registered from another package."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

import suite
from suite.api.registry import UnknownNameError


def test_select_names_wildcards_and_all():
    names = suite.METHODS.names()
    assert {"vanilla", "no_dropout", "scores_dropout", "scores_dropout_naive", "uniform"} <= set(names)
    assert suite.METHODS.select("all") == names
    scores = suite.METHODS.select("scores_*")
    assert {"scores_dropout", "scores_dropout_naive"} <= set(scores)
    assert scores == sorted(scores) and all(n.startswith("scores_") for n in scores)
    assert suite.METHODS.select("vanilla,uniform,vanilla") == ["vanilla", "uniform"]


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        suite.METHODS.select("vanilla,nope")
    assert "unknown method 'nope'" in str(err.value) and "scores_dropout" in str(err.value)
    with pytest.raises(UnknownNameError, match="no method matches 'zzz_\\*'"):
        suite.METHODS.select("zzz_*")


def test_register_requires_a_method_class_with_dataclass_config():
    with pytest.raises(TypeError):
        suite.register_method("bad")(object)

    class NotDataclass(suite.AttentionMethod):
        class Config:
            pass

    with pytest.raises(TypeError, match="dataclass"):
        suite.register_method("bad2")(NotDataclass)


def test_attaching_a_method_registers_it_with_transformers_attention_and_mask_interfaces():
    """Registration is the suite's; transformers learns the implementation (and its mask function, without which
    padding would be ignored) when the method is first attached to a model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from suite.testing import tiny_model

    @dataclasses.dataclass
    class Cfg:
        p: float = 0.0

    @suite.register_method("tmp_registered")
    class Tmp(suite.AttentionMethod):
        Config = Cfg

    try:
        assert Tmp.name == "tmp_registered" and "tmp_registered" in suite.METHODS.names()
        model = Tmp().attach(tiny_model())
        assert model.config._attn_implementation == "suite_tmp_registered"
        assert "suite_tmp_registered" in AttentionInterface._global_mapping
        assert "suite_tmp_registered" in AttentionMaskInterface._global_mapping
    finally:
        suite.METHODS.remove("tmp_registered")


def test_a_description_is_the_docstrings_whole_first_paragraph():
    @dataclasses.dataclass
    class Cfg:
        p: float = 0.0

    @suite.register_method("tmp_described")
    class Tmp(suite.AttentionMethod):
        """A first sentence that runs on past the first line break of the docstring, as a long one does, and ends
        here.

        A second paragraph the listing leaves out."""
        Config = Cfg

    try:
        assert Tmp.description == ("A first sentence that runs on past the first line break of the docstring, as a "
                                   "long one does, and ends here.")
    finally:
        suite.METHODS.remove("tmp_described")
    # the two built-ins whose first paragraph spans lines (`list` cut them mid-sentence)
    assert suite.METHODS.get("dynamicconv").description.endswith("the suite's first version).")
    assert suite.METHODS.get("uniform").description.endswith("no identity setting.")


PLUGIN = '''
import dataclasses
import suite

@dataclasses.dataclass
class Config:
    temperature: float = 1.0

@suite.register_method("plugin_softmax")
class PluginSoftmax(suite.AttentionMethod):
    """Softmax with a temperature, from an installed plugin package."""
    Config = Config
    identity = {"temperature": 1.0}

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        s = suite.scores(query, key, scaling / self.cfg.temperature, attention_mask)
        return suite.attend(module, suite.softmax(s), value)
'''


def test_plugin_package_appears_through_entry_point(tmp_path):
    """A package installed beside the suite registers a method with no edit here (entry point group suite.methods)."""
    (tmp_path / "my_plugin").mkdir()
    (tmp_path / "my_plugin" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[suite.methods]\nplugin_softmax = my_plugin\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "suite", "list"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "plugin_softmax" in out.stdout and "temperature=1.0" in out.stdout
    code = ("import suite; print(suite.METHODS.select('plugin_*'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "['plugin_softmax']" in out.stdout, out.stderr


def test_a_plugin_cannot_silently_replace_a_built_in_method():
    """Old records would count as done for new code under the same hash, and `vanilla` is the report's reference."""
    from suite.run.settings import RunConfig, TrainSettings

    original = suite.METHODS.get("vanilla")
    job = RunConfig("m", "rte", "vanilla", {}, 1, TrainSettings())
    before = job.hash

    class Impostor(suite.AttentionMethod):
        """Not vanilla at all."""

    with pytest.raises(ValueError, match="already registered .*replace=True"):
        suite.register_method("vanilla")(Impostor)
    assert suite.METHODS.get("vanilla") is original and job.hash == before
    try:
        suite.register_method("vanilla", replace=True)(Impostor)
        assert suite.METHODS.get("vanilla") is Impostor
        assert job.hash != before  # the replacing code enters the hash: old records are not taken for its runs
    finally:
        suite.METHODS.add("vanilla", original, replace=True)
        suite.METHODS.replaced.discard("vanilla")
    assert job.hash == before


@pytest.mark.parametrize("name", ["../escape", "a/b", "with space", ""])
def test_method_names_that_cannot_name_a_record_file_are_refused(name):
    class Fine(suite.AttentionMethod):
        pass

    with pytest.raises(ValueError, match="letters, digits"):
        suite.register_method(name)(Fine)
    assert name not in suite.METHODS


@pytest.mark.parametrize("kind", ["method", "task"])
def test_a_name_longer_than_a_file_name_can_hold_is_refused_at_registration(kind):
    """A 300-letter plugin method registered, trained, and then its record could not be written (lost)."""
    from suite.api.registry import MAX_NAME_BYTES
    from suite.api.tasks import TASKS

    registry = suite.METHODS if kind == "method" else TASKS
    entry = type("Fine", (suite.AttentionMethod,), {}) if kind == "method" else object()
    for name in ("m" * 300, "é" * (MAX_NAME_BYTES // 2 + 1)):  # bytes, not letters: é is two in UTF-8
        with pytest.raises(ValueError, match=f"{kind} name .* bytes long; a {kind} name may have at most 64"):
            registry.add(name, entry)
        assert name not in registry
    fits = "m" * MAX_NAME_BYTES
    registry.add(fits, entry)
    registry.remove(fits)


def test_register_method_refuses_a_long_name_before_anything_trains():
    class Fine(suite.AttentionMethod):
        pass

    with pytest.raises(ValueError, match="at most 64"):
        suite.register_method("x" * 300)(Fine)
    assert "x" * 300 not in suite.METHODS


def _plugin_dist(root, name: str, body: str) -> None:
    (root / f"{name}.py").write_text(body)
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[suite.methods]\n{name} = {name}\n")


def test_a_plugin_that_exits_or_raises_while_imported_is_left_out_with_a_warning(tmp_path):
    """A plugin whose import called sys.exit(0) ended `run` with exit 0, no records and no message. Now it, and one
    raising anything else, is left out with a warning (with whatever it registered before failing), and the grid of
    the other methods goes on."""
    registers = textwrap.dedent('''
        import suite

        @suite.register_method("{name}_half")
        class Half(suite.AttentionMethod):
            """Registered before the failure: must not stay."""
    ''')
    _plugin_dist(tmp_path, "exits_plugin", registers.format(name="exits_plugin") + "\nimport sys\nsys.exit(0)\n")
    _plugin_dist(tmp_path, "raises_plugin", registers.format(name="raises_plugin") + "\nraise KeyError('boom')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "suite", "run", "--methods", "all", "--tasks", "rte", "--dry-run",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ("warning: the method plugin 'exits_plugin' failed to load and is left out: its import called "
            "sys.exit(0)") in out.stderr
    assert "the method plugin 'raises_plugin' failed to load and is left out: KeyError: 'boom'" in out.stderr
    assert "rte/vanilla/seed1" in out.stdout and "_half" not in out.stdout


def test_temporary_methods_register_for_one_block_even_when_it_raises():
    from suite.testing import temporary_methods

    Vanilla = suite.METHODS.get("vanilla")

    class Toy(Vanilla):
        pass

    with pytest.raises(RuntimeError), temporary_methods() as add:
        assert add(Toy, "toy_for_one_block") == "toy_for_one_block"
        assert suite.METHODS.get("toy_for_one_block") is Toy
        raise RuntimeError("the block fails")
    assert "toy_for_one_block" not in suite.METHODS.names()
