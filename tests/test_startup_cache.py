"""What `list` and dry runs read instead of importing torch (suite.api.startup_cache): the methods' catalog and the
CPU's bf16 answer. An entry answers only while every fact of its key holds; the catalog says what the classes say,
plugins (a replacement of a built-in included) and hashes too."""
import dataclasses
import json
import os
import sys
import textwrap
import time

import pytest
from test_cli_startup import run_fresh, without_torch

import suite
from suite.api import method_facts, startup_cache
from suite.api.method_facts import METHODS, MethodFacts, catalog_of_methods
from suite.api.registry import Registry, normalise
from suite.grid import plan
from suite.run import device
from suite.run.settings import TrainSettings


@pytest.fixture
def settled(monkeypatch):
    """Files written by the test count as older than the process (else no entry would be written for them)."""
    monkeypatch.setattr(startup_cache, "_process_started_ns", lambda: time.time_ns() + 10**10)


def test_an_entry_answers_only_while_its_key_holds(tmp_path, monkeypatch, settled):
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path / "cache"))
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    static = {"python": "3.x", "path": ["a"]}
    assert startup_cache.read("facts", static) is None  # nothing kept yet
    assert startup_cache.write("facts", static, [str(code), str(tmp_path / "absent.py")], {"answer": 42})
    assert startup_cache.read("facts", static) == {"answer": 42}
    assert startup_cache.read("facts", {**static, "path": ["b"]}) is None  # another interpreter or sys.path
    (tmp_path / "absent.py").write_text("")  # a file that would now be found where there was none
    assert startup_cache.read("facts", static) is None
    (tmp_path / "absent.py").unlink()
    assert startup_cache.read("facts", static) == {"answer": 42}
    code.write_text("x = 2\n")  # the same size: the times and the change time still differ
    assert startup_cache.read("facts", static) is None
    entry = next((tmp_path / "cache" / "startup").glob("facts-*.json"))
    entry.write_text(entry.read_text()[:-5])  # a damaged entry is a miss, never an error
    assert startup_cache.read("facts", static) is None
    monkeypatch.setenv("SUITE_CACHE_DIR", "off")
    assert not startup_cache.write("facts", static, [str(code)], 1) and startup_cache.read("facts", static) is None


def test_no_entry_is_written_for_code_changed_while_the_process_ran(tmp_path, monkeypatch):
    """An edit made after the process imported a file (or within a file system's time resolution before) could hide
    behind an unchanged key: such an entry is not written."""
    monkeypatch.setenv("SUITE_CACHE_DIR", str(tmp_path / "cache"))
    code = tmp_path / "code.py"
    code.write_text("x = 1\n")
    assert not startup_cache.write("facts", {}, [str(code)], 1)
    assert startup_cache.read("facts", {}) is None


def test_entries_are_used_only_by_planning_commands_without_torch(monkeypatch):
    monkeypatch.setattr(startup_cache, "_plan_only", True)
    assert "torch" in sys.modules and not startup_cache.usable()  # here torch is imported: ask it
    monkeypatch.setattr(startup_cache, "_plan_only", False)
    assert not startup_cache.usable()


@pytest.mark.parametrize("text, cpu_only", [
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", True),
    ("__version__ = '2.13.0'\ncuda = None\nhip = None\n", True),
    ("__version__ = '2.13.0+cu128'\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", False),
    ("__version__ = '2.13.0+rocm6.4'\ncuda: Optional[str] = None\nhip: Optional[str] = '6.4'\n", False),
    ("__version__ = '3.0'\n", False),  # a layout this code does not know: ask torch
    (None, False),
])
def test_a_torch_without_gpus_is_known_from_its_version_file(text, cpu_only, monkeypatch):
    """Under a torch built without CUDA and ROCm, `--device auto` is the CPU: torch.cuda says so on any machine."""
    monkeypatch.setattr(device, "_torch_version_file", lambda: text)
    assert device._torch_without_gpus() is cpu_only


def test_device_type_is_pick_device_type_here():
    for requested in ("auto", "cpu"):
        assert device.device_type(requested) == device.pick_device(requested).type


def catalog_registry() -> Registry:
    stored = json.loads(json.dumps(catalog_of_methods()))  # as read back from the file
    return Registry.holding("method", [(n, MethodFacts.from_json(f), o) for n, f, o in stored["entries"]],
                            key=normalise, replaced=stored["replaced"])


def test_the_catalog_says_what_the_classes_say(monkeypatch):
    """Names (both orders), selections, each method's facts, replacements and origins; and the grid planned from it
    (labels, record names: hashes) is the grid planned from the classes."""
    METHODS.load()
    original = METHODS.get("vanilla")

    class Impostor(suite.AttentionMethod):
        """Not vanilla at all."""

    for replaced in (False, True):
        if replaced:
            suite.register_method("vanilla", replace=True)(Impostor)
        try:
            catalog = catalog_registry()
            assert catalog.names() == METHODS.names()
            assert catalog.names(registration_order=True) == METHODS.names(registration_order=True)
            for pattern in ("all", "scores_*", "Scores-Dropout-*", "vanilla,TOPK"):
                assert catalog.select(pattern) == METHODS.select(pattern)
            for name in METHODS.names():
                assert catalog.get(name) == MethodFacts.of(METHODS.get(name))
                assert catalog.is_replacement(name) == METHODS.is_replacement(name)
                assert catalog.origin(name) == METHODS.origin(name)
            assert catalog.is_replacement("vanilla") is replaced
            train = TrainSettings(precision="fp32")
            planned = [(j.label, j.filename) for j in
                       plan.build_grid(["minilm"], ["rte", "stsb"], METHODS.names(), [1, 2], train)]
            with monkeypatch.context() as patch:
                for module in (method_facts, plan):
                    patch.setattr(module, "method_registry", lambda: catalog)
                from_catalog = [(j.label, j.filename) for j in
                                plan.build_grid(["minilm"], ["rte", "stsb"], METHODS.names(), [1, 2], train)]
            assert from_catalog == planned
        finally:
            if replaced:
                METHODS.add("vanilla", original, replace=True)
                METHODS.replaced.discard("vanilla")


def test_methods_whose_facts_cannot_be_kept_exactly_leave_no_catalog():
    """Defaults that JSON would not give back as they are (a tuple), or that do not validate: the classes answer."""
    @dataclasses.dataclass
    class TupleConfig:
        widths: tuple = (3, 5)

    @dataclasses.dataclass
    class BadDefault:
        p: float = 2.0  # impossible: validate() refuses it

    for config in (TupleConfig, BadDefault):
        @suite.register_method("tmp_unkept")
        class Unkept(suite.AttentionMethod):
            Config = config

        try:
            assert catalog_of_methods() is None
        finally:
            METHODS.remove("tmp_unkept")
    assert catalog_of_methods() is not None


PLUGIN = '''
import dataclasses
import suite


@dataclasses.dataclass
class Config:
    p: float = {p}


@suite.register_method("vanilla", replace=True)
class PluginVanilla(suite.AttentionMethod):
    """Vanilla attention as a plugin package ships it."""
    Config = Config

    def attention(self, module, query, key, value, attention_mask, scaling, **kwargs):
        return suite.attend(module, suite.softmax(suite.scores(query, key, scaling, attention_mask)), value)
'''


def test_a_plugin_that_replaces_a_built_in_is_planned_alike_from_the_catalog(tmp_path):
    """Its distribution and version enter the hash from the catalog too; an edit of the plugin is seen at once."""
    site = tmp_path / "site"
    (site / "plugin_vanilla").mkdir(parents=True)
    module = site / "plugin_vanilla" / "__init__.py"
    module.write_text(textwrap.dedent(PLUGIN.format(p=0.1)))
    info = site / "plugin_vanilla-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-vanilla\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text("[suite.methods]\nplugin_vanilla = plugin_vanilla\n")
    time.sleep(3.5)  # older than the process by more than its settling time: the catalog may be written
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    argv = ["run", "--methods", "vanilla", "--tasks", "rte", "--seeds", "1", "--dry-run", "--out", str(tmp_path / "o")]
    plain = run_fresh(argv, "off")[0]  # the suite's own vanilla is not what runs
    reference, _ = run_fresh(argv, "off", **env)
    assert reference != plain and "rte__vanilla__seed1" in reference
    assert without_torch(argv, tmp_path / "cache", **env) == reference
    assert "p=0.1 (float)" in without_torch(["list"], tmp_path / "cache", **env)

    module.write_text(textwrap.dedent(PLUGIN.format(p=0.3)))  # a new default: another hash
    edited, _ = run_fresh(argv, "off", **env)
    assert edited != reference
    assert run_fresh(argv, tmp_path / "cache", **env)[0] == edited


def test_a_runs_folder_read_before_it_exists_is_part_of_the_key(tmp_path):
    """`record_files` of a folder that is not there yet reads it (scandir), so an answer kept from it (a `plan` whose
    pilot has no final runs yet) is computed anew once the folder appears."""
    from suite.run.record import record_files

    runs = tmp_path / "pilot" / "runs"
    found, files = startup_cache.files_read(lambda: record_files(runs))
    assert found == [] and str(runs) in files
    runs.mkdir(parents=True)
    (runs / "a.json").write_text("{}")
    (runs / ".hidden.json").write_text("{}")   # listed, as glob listed it (a reader then names what it is)
    (runs / ".tmp-b.json").write_text("{}")    # an interrupted write: never a record
    (runs / "c.txt").write_text("{}")
    assert record_files(runs) == [runs / ".hidden.json", runs / "a.json"]
