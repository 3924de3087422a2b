"""The plugin gate: version pin, hook verification that stops a server instead of running it without hooks."""

from __future__ import annotations

import pytest

from sgl_ridgefill import compat


def test_pinned_version_is_read_from_package_metadata():
    assert compat.pinned_sglang_version() == "0.5.23"


def test_version_mismatch_is_refused(monkeypatch):
    monkeypatch.setattr(compat, "pinned_sglang_version", lambda: "0.0.1")
    monkeypatch.delenv("RIDGEFILL_ALLOW_SGLANG_VERSION_MISMATCH", raising=False)
    with pytest.raises(compat.SGLangVersionError, match="built for SGLang 0.0.1"):
        compat.check_sglang_version()
    monkeypatch.setenv("RIDGEFILL_ALLOW_SGLANG_VERSION_MISMATCH", "1")
    assert compat.check_sglang_version()


@pytest.fixture()
def cpu_sglang():
    from sgl_ridgefill.cpu.environment import apply_cpu_environment

    apply_cpu_environment()
    pytest.importorskip("sglang.srt.plugins.hook_registry")


def test_missing_hook_stops_the_process(cpu_sglang):
    from sgl_ridgefill import patches

    with pytest.raises(SystemExit) as e:
        patches.verify_hooks(("sglang.srt.managers.scheduler.Scheduler.no_such_method_in_sglang",))
    assert "did not take effect: sglang.srt.managers.scheduler.Scheduler.no_such_method_in_sglang" in str(e.value)
    assert "Refusing to start" in str(e.value)


def test_system_exit_escapes_sglang_plugin_loader(cpu_sglang, monkeypatch):
    """SGLang logs and swallows plugin exceptions; the gate relies on SystemExit not being one of them."""
    import sglang.srt.plugins as plugins

    def failing():
        raise SystemExit("stop")

    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    monkeypatch.setattr(plugins, "load_plugins_by_group", lambda *a, **k: {"ridgefill": (failing, "sgl-ridgefill")})
    with pytest.raises(SystemExit):
        plugins.load_plugins()


def test_enabled_hooks_apply(cpu_sglang):
    from sgl_ridgefill import patches

    from sglang.srt.plugins.hook_registry import HookRegistry

    targets = patches.register_hooks(True)
    HookRegistry.apply_hooks()
    patches.verify_hooks(targets)
    assert patches.missing_hooks(targets) == []


def test_meta_info_is_one_dict_in_the_http_process():
    """The HTTP process loads plugins before it parses ``--prefill-backend``, so it registers only the
    always-on hooks; the one that shows ``meta_info["ridgefill"]`` as one dict must be among them."""
    import subprocess
    import sys

    from sgl_ridgefill.cpu.environment import cpu_environment

    code = (
        "from sgl_ridgefill.cpu.environment import apply_cpu_environment\n"
        "apply_cpu_environment()\n"
        "from sgl_ridgefill import patches, plugin\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "plugin.register()\n"
        "HookRegistry.apply_hooks()\n"
        "print(patches.missing_hooks((patches.GENERATE,)))\n"
    )
    env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_every_response_and_streamed_chunk_shows_one_summary_dict():
    """SGLang accumulates customized info into lists (a streamed request's later chunks too); each response
    that carries the summary shows it as the dict."""
    import asyncio

    from sgl_ridgefill.patches import _summaries_as_dicts

    summary = {"ran": False, "reason": "r"}

    async def responses():
        yield {"meta_info": {"ridgefill": [summary]}}  # the first chunk
        yield {"meta_info": {"ridgefill": [summary], "id": 1}}  # a later chunk: SGLang copies the list again
        yield [{"meta_info": {"ridgefill": [summary]}}, {"meta_info": {}}]  # a batch request
        yield {"text": "no meta"}

    async def collect():
        return [out async for out in _summaries_as_dicts(responses())]

    first, later, batch, plain = asyncio.run(collect())
    assert first["meta_info"]["ridgefill"] == summary and later["meta_info"]["ridgefill"] == summary
    assert batch[0]["meta_info"]["ridgefill"] == summary and "ridgefill" not in batch[1]["meta_info"]
    assert plain == {"text": "no meta"}


def test_a_weight_update_turns_ridgefill_off():
    """S5: the maps were fitted to the weights the server started with; after SGLang loads new weights every
    request runs exact and says why."""
    from sgl_ridgefill.config import ServerConfig
    from sgl_ridgefill.patches import after_weight_update
    from sgl_ridgefill.runtime.admission import Admitter, ServerFacts
    from sgl_ridgefill.runtime.runtime import RidgeFillRuntime, get_runtime, set_runtime

    config = ServerConfig(prefill_backend="ridgefill", maps="m")
    rt = RidgeFillRuntime(config, None, Admitter(config, ServerFacts(num_layers=4)))
    previous = get_runtime()
    set_runtime(rt)
    try:
        assert rt.disabled is None
        after_weight_update(None, object())
        assert "weights were updated" in rt.disabled
        decision = rt.admit({"arm": "ridgefill"})
        assert decision.plan is None and "weights were updated" in decision.reason
    finally:
        set_runtime(previous)


def test_a_plugin_loaded_after_ridgefill_keeps_its_hooks_on_the_same_targets():
    """S4: RidgeFill's hooks are verified after SGLang has applied every plugin's hooks, not applied early by
    RidgeFill's ``register()``, which made SGLang skip another plugin's later hooks on the same targets. And a
    missing hook still stops the process."""
    import subprocess
    import sys

    from sgl_ridgefill import envs
    from sgl_ridgefill.cpu.environment import cpu_environment

    code = (
        "from sgl_ridgefill.cpu.environment import apply_cpu_environment\n"
        "apply_cpu_environment()\n"
        "import inspect, pkgutil, sys\n"
        "import sglang.srt.plugins as plugins\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry, HookType\n"
        "from sgl_ridgefill import patches, plugin\n"
        "def other():\n"
        "    HookRegistry.register(patches.CREATE_REQ, lambda original, *a, **k: original(*a, **k), HookType.AROUND)\n"
        "if sys.argv[1] == 'missing':  # one of RidgeFill's targets that SGLang cannot patch\n"
        "    register_hooks, bad = patches.register_hooks, 'sglang.srt.managers.scheduler.Scheduler.no_such_method'\n"
        "    def with_a_bad_target(enabled):\n"
        "        HookRegistry.register(bad, lambda original, *a, **k: original(*a, **k), HookType.AROUND)\n"
        "        return register_hooks(enabled) + (bad,)\n"
        "    patches.register_hooks = with_a_bad_target\n"
        "plugins.load_plugins_by_group = lambda *a, **k: {'ridgefill': (plugin.register, 'sgl-ridgefill'),\n"
        "                                                 'other': (other, 'other')}\n"
        "plugins.load_plugins()\n"
        "owner, attr = patches.CREATE_REQ.rsplit('.', 1)\n"
        "fn = inspect.getattr_static(pkgutil.resolve_name(owner), attr)\n"
        "wrappers = 0\n"
        "while getattr(fn, '__wrapped__', None) is not None:\n"
        "    fn, wrappers = fn.__wrapped__, wrappers + 1\n"
        "print('missing', patches.missing_hooks(patches.ENABLED_TARGETS))\n"
        "print('wrappers', wrappers)\n"
    )
    env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    env[envs.PREFILL_BACKEND] = "ridgefill"
    run = lambda case: subprocess.run([sys.executable, "-c", code, case], env=env, capture_output=True,  # noqa: E731
                                      text=True, timeout=300)
    proc = run("both")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-2] == "missing []"
    assert lines[-1] == "wrappers 2", proc.stdout  # RidgeFill's AROUND and the other plugin's, both applied
    proc = run("missing")
    assert proc.returncode != 0 and "did not take effect: sglang.srt.managers.scheduler.Scheduler.no_such_method" in (
        proc.stderr + proc.stdout)


def test_every_hook_is_declared_once_and_the_readme_lists_them():
    """One table (patches.HOOKS) gives the registration, the targets verified at startup and the README's list."""
    import pathlib

    from sgl_ridgefill import patches

    every = [t for hook in patches.HOOKS for t in hook.targets]
    assert len(every) == len(set(every)), "a target hooked twice"
    assert set(every) == set(patches.ALWAYS_TARGETS + patches.CPU_TARGETS + patches.ENABLED_TARGETS)
    assert patches.CREATE_REQ in patches.ENABLED_TARGETS and patches.GENERATE in patches.ALWAYS_TARGETS
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert patches.hooks_markdown() in readme
