"""The one declaration of the server settings, and the flags, variables, config, keywords and docs derived
from it."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import subprocess
import sys

import pytest

from sgl_ridgefill import envs, settings
from sgl_ridgefill.cli_args import add_ridgefill_arguments
from sgl_ridgefill.config import ServerConfig
from sgl_ridgefill.engine import ridgefill_environment
from sgl_ridgefill.settings import SETTINGS, SETTINGS_BY_NAME

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
# One value per setting that is not its default, as the variable's text and as the config's value.
SAMPLES = {
    "prefill_backend": ("ridgefill", "ridgefill"),
    "maps": ("/maps", "/maps"),
    "policy": ("p.rfpolicy", "p.rfpolicy"),
    "split": ("12", 12),
    "tail": ("512", 512),
    "arm": ("identity", "identity"),
    "cache_mode": ("namespace", "namespace"),
    "map_dtype": ("int8", "int8"),
    "map_residence": ("host", "host"),
    "map_slots": ("4", 4),
    "split_state_cache_mib": ("0", 0),
    "slice_rows": ("512", 512),
    "upgrade_rows": ("256", 256),
    "diagnostics": ("1", True),
    "request_policies": ("a, b", ("a", "b")),
    "max_tail": ("4096", 4096),
}


@pytest.fixture
def clean_env(monkeypatch):
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    return monkeypatch


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_server")
    assert add_ridgefill_arguments(parser)
    assert not add_ridgefill_arguments(parser)  # once only
    return parser


def test_samples_cover_every_setting():
    assert list(SAMPLES) == [s.name for s in SETTINGS]


def test_names_follow_the_settings():
    s = SETTINGS_BY_NAME["max_tail"]
    assert (s.flag, s.env, s.keyword) == ("--ridgefill-max-tail", "RIDGEFILL_MAX_TAIL", "ridgefill_max_tail")
    b = SETTINGS_BY_NAME["prefill_backend"]
    assert (b.flag, b.env, b.keyword) == ("--prefill-backend", "RIDGEFILL_PREFILL_BACKEND", None)
    assert all(s.env.startswith(envs.PREFIX) for s in SETTINGS)


def test_envs_holds_every_setting_variable():
    assert envs.SERVER == {s.name: s.env for s in SETTINGS}
    assert set(envs.ALL) == {s.env for s in SETTINGS} | {
        envs.ALLOW_VERSION_MISMATCH, envs.CACHE_DIR, envs.CENSUS, envs.BF16_MATMUL}
    assert all(name.startswith(envs.PREFIX) for name in envs.ALL)
    assert envs.PREFILL_BACKEND == "RIDGEFILL_PREFILL_BACKEND"


def test_the_policy_language_has_the_same_arms_and_cache_modes():
    from sgl_ridgefill import policy

    assert (policy.ARMS, policy.CACHE_MODES) == (settings.ARMS, settings.CACHE_MODES)


def test_config_has_one_field_per_setting_with_its_default():
    assert [(f.name, f.default) for f in dataclasses.fields(ServerConfig)] == [(s.name, s.default) for s in SETTINGS]


@pytest.mark.parametrize("name", list(SAMPLES))
def test_from_env_reads_every_setting(name, clean_env):
    text, value = SAMPLES[name]
    clean_env.setenv(SETTINGS_BY_NAME["maps"].env, "/maps")
    clean_env.setenv(SETTINGS_BY_NAME[name].env, text)
    assert getattr(ServerConfig.from_env(), name) == value


@pytest.mark.parametrize("name", list(SAMPLES))
def test_every_flag_parses_and_exports_its_variable(name, clean_env):
    import os

    setting = SETTINGS_BY_NAME[name]
    text, value = SAMPLES[name]
    argv = [setting.flag] if isinstance(setting, settings.SwitchSetting) else [setting.flag, text]
    args = _parser().parse_args(argv)
    assert getattr(args, setting.flag[2:].replace("-", "_")) == value
    assert os.environ[setting.env] == setting.text(value)
    clean_env.setenv(SETTINGS_BY_NAME["maps"].env, "/maps")
    assert getattr(ServerConfig.from_env(), name) == value  # what the scheduler reads back


def test_a_given_flag_wins_over_an_exported_variable(clean_env):
    """C15: a stale ``RIDGEFILL_PREFILL_BACKEND=ridgefill`` loses to ``--prefill-backend default``; without the
    flag the exported variable applies (the documented offline recipe)."""
    import os

    clean_env.setenv(envs.PREFILL_BACKEND, "ridgefill")
    clean_env.setenv(SETTINGS_BY_NAME["tail"].env, "99")
    _parser().parse_args(["--prefill-backend", "default", "--ridgefill-tail", "7"])
    assert (os.environ[envs.PREFILL_BACKEND], os.environ[SETTINGS_BY_NAME["tail"].env]) == ("default", "7")
    assert not ServerConfig.from_env().enabled and not envs.ridgefill_enabled()
    _parser().parse_args([])
    assert os.environ[envs.PREFILL_BACKEND] == "default"


def test_actions_suit_sglangs_config_file_merger(clean_env, tmp_path):
    """SGLang's ``--config`` YAML merger accepts only store and store_true actions."""
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    import os

    parser = _parser()
    merger = ConfigArgumentMerger(parser)
    dests = {a.dest for a in parser._actions if a.option_strings}  # noqa: SLF001
    assert not dests & set(merger.unsupported_actions)
    assert "ridgefill_diagnostics" in merger.store_true_actions
    config = tmp_path / "server.yaml"
    config.write_text("ridgefill-diagnostics: true\nridgefill-max-tail: 2048\nprefill-backend: ridgefill\n")
    parser.parse_args(merger.merge_config_with_args(["--config", str(config)]))
    assert (os.environ["RIDGEFILL_DIAGNOSTICS"], os.environ["RIDGEFILL_MAX_TAIL"]) == ("1", "2048")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ridgefill-split", "0"], "argument --ridgefill-split: must be >= 1, got 0"),
        (["--ridgefill-max-tail", "x"], "argument --ridgefill-max-tail: 'x' is not an integer"),
        (["--ridgefill-request-policies", "a,,b"], "argument --ridgefill-request-policies: 'a,,b' has an empty name"),
        (["--ridgefill-arm", "fast"], "argument --ridgefill-arm: invalid choice: 'fast'"),
    ],
)
def test_flag_errors(argv, message, clean_env, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_tail=0), "--ridgefill-max-tail must be >= 1, got 0"),
        (dict(diagnostics="yes"), "--ridgefill-diagnostics must be true or false, got 'yes'"),
        (dict(request_policies=("",)), "--ridgefill-request-policies must be names of 1 to 200 characters, got ('',)"),
        (dict(map_dtype="fp8"), "--ridgefill-map-dtype 'fp8' is not one of auto, bfloat16, float32, int8"),
        (dict(prefill_backend="on"), "--prefill-backend 'on' is not one of default, ridgefill"),
    ],
)
def test_config_errors_name_the_flag(kw, message):
    with pytest.raises(ValueError) as e:
        ServerConfig(**kw)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("diagnostics", "maybe", "RIDGEFILL_DIAGNOSTICS='maybe' (--ridgefill-diagnostics) is not one of 1, true, yes, "
                                 "on, 0, false, no, off"),
        ("max_tail", "lots", "RIDGEFILL_MAX_TAIL='lots' (--ridgefill-max-tail) is not an integer"),
    ],
)
def test_variable_errors_name_the_variable_and_the_flag(name, text, message, clean_env):
    clean_env.setenv(SETTINGS_BY_NAME[name].env, text)
    with pytest.raises(ValueError) as e:
        ServerConfig.from_env()
    assert str(e.value) == message


def test_switch_off_by_variable(clean_env):
    clean_env.setenv("RIDGEFILL_DIAGNOSTICS", "0")
    assert ServerConfig.from_env().diagnostics is False


def test_engine_keywords_are_exactly_the_prefixed_settings():
    assert set(settings.keyword_settings()) == {s.keyword for s in SETTINGS if s.name != "prefill_backend"}
    options = {s.keyword: SAMPLES[s.name][1] for s in SETTINGS if s.keyword}
    env = ridgefill_environment(**options)
    assert env == {s.env: s.text(SAMPLES[s.name][1]) for s in SETTINGS} | {envs.PREFILL_BACKEND: "ridgefill"}
    assert env["RIDGEFILL_DIAGNOSTICS"] == "1" and env["RIDGEFILL_REQUEST_POLICIES"] == "a,b"
    assert ServerConfig.from_env(env) == ServerConfig(**{n: v for n, (_, v) in SAMPLES.items()})
    with pytest.raises(ValueError, match="unknown RidgeFill option"):
        ridgefill_environment(ridgefill_prefill_backend="ridgefill")


def test_cli_flags_and_engine_keywords():
    values = {"maps": "/m", "split": 12, "diagnostics": True, "request_policies": ("a", "b"), "tail": None}
    assert settings.cli_flags({"prefill_backend": "ridgefill", **values}) == [
        "--prefill-backend", "ridgefill", "--ridgefill-maps", "/m", "--ridgefill-split", "12",
        "--ridgefill-diagnostics", "--ridgefill-request-policies", "a,b",
    ]
    assert settings.cli_flags({"diagnostics": False}) == []
    assert settings.engine_keywords(values) == {
        "ridgefill_maps": "/m", "ridgefill_split": 12, "ridgefill_diagnostics": True,
        "ridgefill_request_policies": ("a", "b"), "ridgefill_tail": None,
    }
    with pytest.raises(ValueError, match="no keyword for prefill_backend"):
        settings.engine_keywords({"prefill_backend": "ridgefill"})
    with pytest.raises(ValueError, match="unknown RidgeFill setting"):
        settings.cli_flags({"tial": 3})


def test_eval_server_and_engine_turn_diagnostics_on(tmp_path):
    from sgl_ridgefill.eval import cli

    args = argparse.Namespace(maps=tmp_path / "maps", tail=1024, upgrade_rows=0)
    rf = cli._ridgefill_settings(args, 12, tmp_path / "eval-rows.rfpolicy")
    assert "--ridgefill-diagnostics" in settings.cli_flags(rf)
    assert settings.engine_keywords(rf)["ridgefill_diagnostics"] is True
    # The exact upgrade off unless asked for: it would rewrite the rows an answer's later tokens read.
    parser = argparse.ArgumentParser()
    cli.add_subparser(parser.add_subparsers())
    assert parser.parse_args(["eval", "--model", "m", "--maps", "d", "--out", "o"]).upgrade_rows == 0
    assert rf["upgrade_rows"] == 0
    args.upgrade_rows = 512
    flags = settings.cli_flags(cli._ridgefill_settings(args, 12, tmp_path / "eval-rows.rfpolicy"))
    assert flags[flags.index("--ridgefill-upgrade-rows") + 1] == "512"


@pytest.mark.parametrize(
    "kw, allowed, refused",
    [
        (dict(), ["mine"], ["plain", "other"]),
        (dict(request_policies=("plain",)), ["mine", "plain"], ["other"]),
        (dict(request_policies=("all",)), ["mine", "plain", "other"], []),
        (dict(diagnostics=True), ["mine", "plain", "other"], []),
    ],
)
def test_allows_policy(kw, allowed, refused):
    cfg = ServerConfig(**kw)
    assert all(cfg.allows_policy(n, own="mine") for n in allowed)
    assert not any(cfg.allows_policy(n, own="mine") for n in refused)
    assert not ServerConfig().allows_policy("plain", own=None)


def test_readme_has_the_generated_flag_table():
    assert settings.settings_markdown() in README.read_text()


def test_module_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "sgl_ridgefill.settings", "--markdown"], check=True,
                         capture_output=True, text=True).stdout
    assert out == settings.settings_markdown()
    rows = out.splitlines()[2:]
    assert [r.split("|")[1].strip().strip("`").split()[0] for r in rows] == [s.flag for s in SETTINGS]
