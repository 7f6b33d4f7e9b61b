"""`[tool.matlint]`: discovery, selection (ruff's longest-prefix rule), per-file-ignores, rule
options, validation errors that name the key and the file, and the cache fingerprint."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

from matlint import config
from matlint.config import ConfigError, Settings, load_settings
from matlint.registry import all_rules, get_rule
from matlint.rule import Option, Rule

from matlint_helpers import TRACEBACK, bad_example, run_matlint, write

ENGINE_CODES = {cls.code for cls in all_rules() if cls.code.startswith("MAT0")}


def _settings(tmp_path, table: str = "", **overrides) -> Settings:
    write(tmp_path / "pyproject.toml", "[tool.matlint]\n" + table)
    return load_settings(tmp_path, cli_overrides=overrides)


def _codes(settings) -> set:
    return set(settings.enabled_codes())


def test_nearest_pyproject_with_a_matlint_table_wins(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nselect = ["MAT5"]\n')
    write(tmp_path / "sub" / "pyproject.toml", "[project]\nname = 'x'\n")  # no [tool.matlint]: skipped
    write(tmp_path / "sub" / "deeper" / "m.py", "")
    settings = load_settings(tmp_path / "sub" / "deeper" / "m.py")
    assert settings.config_file == str(tmp_path / "pyproject.toml")
    assert settings.root == str(tmp_path)
    assert settings.select == ("MAT5",)


def test_no_config_means_defaults_rooted_at_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = load_settings(tmp_path)
    assert settings.config_file is None and settings.root == str(tmp_path)
    assert _codes(settings) == {cls.code for cls in all_rules() if cls.default_enabled}


def test_config_option_overrides_discovery(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nselect = ["MAT5"]\n')
    other = write(tmp_path / "elsewhere" / "matlint.toml", 'select = ["MAT1"]\n')
    assert load_settings(tmp_path, config_file=other).select == ("MAT1",)
    with pytest.raises(ConfigError, match="missing.toml"):
        load_settings(tmp_path, config_file=tmp_path / "missing.toml")


def _on(prefix: str) -> set:
    """Rules a selector switches on: prefixes longer than MAT reach default-off rules too."""
    return {cls.code for cls in all_rules() if cls.code.startswith(prefix) and not cls.code.startswith("MAT0")
            and (cls.default_enabled or len(prefix) > len("MAT"))}


DEFAULT_ON = _on("MAT")


@pytest.mark.parametrize("table, overrides, expected", [
    ("", {}, lambda: DEFAULT_ON | ENGINE_CODES),
    ('select = ["MAT1"]\n', {}, lambda: _on("MAT1") | ENGINE_CODES),
    ('select = ["MAT1"]\nextend-select = ["MAT502"]\n', {}, lambda: _on("MAT1") | {"MAT502"} | ENGINE_CODES),
    ('ignore = ["MAT5"]\n', {}, lambda: DEFAULT_ON - _on("MAT5") | ENGINE_CODES),
    # the longest matching prefix wins ...
    ('select = ["MAT502"]\nignore = ["MAT5"]\n', {}, lambda: {"MAT502"} | ENGINE_CODES),
    ('select = ["MAT5"]\nignore = ["MAT502"]\n', {}, lambda: _on("MAT5") - {"MAT502"} | ENGINE_CODES),
    # ... and ignore wins ties
    ('select = ["MAT1"]\nignore = ["MAT1"]\n', {}, lambda: ENGINE_CODES),
    # engine codes are on unless ignored
    ('ignore = ["MAT0"]\n', {}, lambda: DEFAULT_ON),
    ('ignore = ["MAT001"]\n', {}, lambda: DEFAULT_ON | ENGINE_CODES - {"MAT001"}),
    ('ignore = ["ALL"]\nselect = ["MAT101"]\n', {}, lambda: {"MAT101"}),
    # a command-line select starts afresh (the config's ignore goes too); ignore adds
    ('ignore = ["MAT1"]\n', {"select": ["MAT1"]}, lambda: _on("MAT1") | ENGINE_CODES),
    ("", {"ignore": "MAT101,MAT502"}, lambda: DEFAULT_ON - {"MAT101", "MAT502"} | ENGINE_CODES),
    ('select = ["MAT1"]\n', {"extend_select": ["MAT5"]}, lambda: _on("MAT1") | _on("MAT5") | ENGINE_CODES),
])
def test_selection(tmp_path, table, overrides, expected):
    assert _codes(_settings(tmp_path, table, **overrides)) == expected()


class _DefaultOff(Rule):
    code = "MAT199"
    name = "test-default-off"
    summary = "a rule that is off unless selected"
    docs = ""
    default_enabled = False


@pytest.fixture
def with_default_off_rule(monkeypatch):
    monkeypatch.setattr(config, "all_rules", lambda: all_rules() + (_DefaultOff,))
    config._enabled_codes.cache_clear()
    yield
    config._enabled_codes.cache_clear()


@pytest.mark.parametrize("select, on", [
    (["MAT"], False), (["MAT1"], True), (["MAT19"], True), (["MAT199"], True), (["ALL"], True), (["MAT5"], False),
])
def test_default_off_rule_needs_a_selector_longer_than_mat(tmp_path, with_default_off_rule, select, on):
    settings = _settings(tmp_path, f"select = {json.dumps(select)}\n")
    assert ("MAT199" in _codes(settings)) is on
    assert (_DefaultOff in settings.enabled_rules()) is on


@pytest.mark.parametrize("table, key", [
    ('colour = "red"\n', "colour"),
    ('select = "MAT1"\n', "select"),
    ('select = ["E501"]\n', "select"),
    ('extend-ignore = ["MAT9"]\n', "extend-ignore"),
    ("respect-gitignore = 1\n", "respect-gitignore"),
    ("cache-dir = 3\n", "cache-dir"),
    ('[tool.matlint.per-file-ignores]\n"tests/*" = "MAT1"\n', "per-file-ignores.tests/*"),
    ('[tool.matlint.per-file-ignores]\n"tests/*" = ["XYZ"]\n', "per-file-ignores.tests/*"),
    ("[tool.matlint.rules.MAT999]\nx = 1\n", "rules.MAT999"),
    ("[tool.matlint.rules.MAT101]\nno-such-option = 1\n", "rules.MAT101.no-such-option"),
])
def test_bad_config_names_key_and_file(tmp_path, table, key):
    with pytest.raises(ConfigError) as error:
        _settings(tmp_path, table)
    assert f"`{key}`" in str(error.value)
    assert str(tmp_path / "pyproject.toml") in str(error.value)
    result = run_matlint("check", ".", cwd=tmp_path)
    assert result.returncode == 2
    assert key in result.stderr and str(tmp_path / "pyproject.toml") in result.stderr
    assert TRACEBACK not in result.stderr


def test_invalid_toml_is_a_config_error(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.matlint\n")
    result = run_matlint("check", ".", cwd=tmp_path)
    assert result.returncode == 2 and "invalid TOML" in result.stderr and TRACEBACK not in result.stderr


@pytest.fixture
def mat101_with_options(monkeypatch):
    cls = get_rule("MAT101")
    monkeypatch.setattr(cls, "options", {"max-depth": Option(int, 2, "how deep"), "ratio": Option(float, 0.5, "r"),
                                         "names": Option(list, [], "names")})
    return cls


def test_rule_options_by_code_or_name(tmp_path, mat101_with_options):
    settings = _settings(tmp_path, "[tool.matlint.rules.python-loop-matmul]\nmax_depth = 3\nratio = 1\nnames = ['a']\n")
    assert settings.rule_options == {"MAT101": {"max-depth": 3, "ratio": 1.0, "names": ["a"]}}
    settings = _settings(tmp_path, "[tool.matlint.rules.MAT101]\nmax-depth = 4\n")
    assert settings.rule_options == {"MAT101": {"max-depth": 4}}


@pytest.mark.parametrize("value", ['"3"', "true", "2.5"])
def test_rule_option_of_the_wrong_type(tmp_path, mat101_with_options, value):
    with pytest.raises(ConfigError, match=r"`rules\.MAT101\.max-depth` must be of type int"):
        _settings(tmp_path, f"[tool.matlint.rules.MAT101]\nmax-depth = {value}\n")


def test_per_file_ignores(tmp_path):
    settings = _settings(tmp_path, '[tool.matlint.per-file-ignores]\n"legacy/*.py" = ["MAT1"]\n"*_test.py" = ["MAT502"]\n')
    assert settings.is_ignored(tmp_path / "legacy" / "old.py", "MAT101")
    assert not settings.is_ignored(tmp_path / "legacy" / "old.py", "MAT502")
    assert not settings.is_ignored(tmp_path / "new" / "old.py", "MAT101")
    assert settings.is_ignored(tmp_path / "deep" / "dir" / "x_test.py", "MAT502")


def test_per_file_ignores_end_to_end(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.matlint.per-file-ignores]\n"legacy/*" = ["MAT101"]\n')
    write(tmp_path / "legacy" / "old.py", bad_example("MAT101").code)
    write(tmp_path / "new.py", bad_example("MAT101").code)
    result = run_matlint("check", "--format", "json", "--select", "MAT101", cwd=tmp_path)
    assert {f["filename"] for f in json.loads(result.stdout)} == {"new.py"}


def test_exclude_and_extend_exclude_end_to_end(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nextend-exclude = ["generated", "*_pb2.py"]\n')
    for name in ("generated/a.py", "x_pb2.py", "kept.py", "build/b.py"):
        write(tmp_path / name, bad_example("MAT101").code)
    result = run_matlint("check", "--format", "json", cwd=tmp_path)
    assert {f["filename"] for f in json.loads(result.stdout)} == {"kept.py"}
    # `exclude` replaces the defaults, so build/ is linted again
    write(tmp_path / "pyproject.toml", '[tool.matlint]\nexclude = ["generated"]\n')
    result = run_matlint("check", "--format", "json", cwd=tmp_path)
    assert {f["filename"] for f in json.loads(result.stdout)} == {"kept.py", "x_pb2.py", "build/b.py"}


def test_settings_pickle_and_a_stable_fingerprint(tmp_path):
    settings = _settings(tmp_path, 'select = ["MAT1"]\n')
    assert pickle.loads(pickle.dumps(settings)) == settings
    code = ("import sys; from matlint.config import load_settings; "
            "print(load_settings(sys.argv[1], cli_overrides={'select': ['MAT1']}).fingerprint())")
    other_process = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert other_process.stdout.strip() == settings.fingerprint()
    assert _settings(tmp_path, 'select = ["MAT5"]\n').fingerprint() != settings.fingerprint()
    # per-file-ignores are applied after the cache, so they do not change the key
    with_pfi = _settings(tmp_path, 'select = ["MAT1"]\n[tool.matlint.per-file-ignores]\n"a.py" = ["MAT1"]\n')
    assert with_pfi.fingerprint() == settings.fingerprint()


def test_fingerprint_follows_rule_options(tmp_path, mat101_with_options):
    a = _settings(tmp_path, "[tool.matlint.rules.MAT101]\nmax-depth = 3\n")
    b = _settings(tmp_path, "[tool.matlint.rules.MAT101]\nmax-depth = 4\n")
    assert a.fingerprint() != b.fingerprint()


def test_cache_dir_is_relative_to_the_config(tmp_path):
    settings = _settings(tmp_path, 'cache-dir = "var/cache"\n')
    assert settings.cache_path() == tmp_path / "var" / "cache"
    assert _settings(tmp_path).cache_path() == tmp_path / ".matlint_cache"


def test_rule_options_reach_the_rule_through_the_cli_and_the_cache(tmp_path):
    assert "min_dim" in get_rule("MAT403").options
    write(tmp_path / "m.py", bad_example("MAT403").code)

    def codes(option_table: str) -> list:
        write(tmp_path / "pyproject.toml", '[tool.matlint]\nselect = ["MAT403"]\n' + option_table)
        result = run_matlint("check", "--format", "json", cwd=tmp_path)
        assert result.returncode in (0, 1), result.stderr
        return [f["code"] for f in json.loads(result.stdout)]

    assert codes("") == ["MAT403"] * len(bad_example("MAT403").expect)
    # Sizes below min_dim are ignored: a huge min_dim silences the rule (the cache must not answer).
    assert codes("[tool.matlint.rules.MAT403]\nmin_dim = 1000000000\n") == []
    assert codes("[tool.matlint.rules.gemm-dim-not-multiple-of-8]\nmin-dim = 1\n") == \
        ["MAT403"] * len(bad_example("MAT403").expect)
