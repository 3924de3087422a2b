"""Property-based fuzzing of what clients and operators send RidgeFill: request parameters and policies.

Request bodies: Hypothesis draws values of ``custom_params["ridgefill"]``, valid and invalid (every key of
:data:`~sgl_ridgefill.request_schema.REQUEST_KEYS` with in-range values, wrong types, integers at and beyond
2**64, NaN and infinities, nested objects and lists, unknown keys, long strings, the shorthands), and the
fuzzer posts each to a running RidgeFill server's ``/generate``. Every answer must be a 2xx or a 4xx, and
``/health`` must answer 200 after each batch.

Policies: Hypothesis draws ``.rfpolicy`` texts (``sgl_ridgefill.policy.strategies``: formatted policy
trees, random text, random token sequences, shipped policies with random edits). Each is parsed, formatted
and parsed again (the same tree), compiled against the served maps and checked through
``sgl-ridgefill policy check`` in this process: anything but a ``PolicyError`` is a failure. A policy is a
server setting, not a request field, so what reaches the server is the policy's name (or, when it does not
parse, its text) as a request's ``policy``: again 2xx or 4xx only.

Needs ``hypothesis`` (a test dependency). Bounded by counts and a deadline.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..request_schema import ARMS, REQUEST_KEYS, SPLICES, BoolKey, EnumKey, IntKey, PolicyKey, RowsKey, SpliceKey
from .workload import NAMESPACE_POLICY, Shape

BATCH = 50  # bodies between two /health checks
SHOWN = 5
HUGE_INTS = (2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, -(2**63) - 1, -(2**64), 2**100, 10**30)


# ----------------------------------------------------------------------------- strategies
def _strategies(policy_names: Sequence[str]):
    from hypothesis import strategies as st

    floats = st.floats(allow_nan=True, allow_infinity=True)
    ints = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from(HUGE_INTS))
    long_strings = st.integers(1_000, 200_000).map(lambda n: "ä" * n)
    scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=40), long_strings)
    any_json = st.recursive(
        scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
        max_leaves=12,
    )
    names = st.one_of(st.sampled_from([*policy_names, NAMESPACE_POLICY, "plain"]), st.text(max_size=260))

    def valid(key):
        if isinstance(key, BoolKey):
            return st.booleans()
        if isinstance(key, IntKey):
            return st.one_of(st.integers(key.lo, min(key.hi, key.lo + 64)), st.integers(key.lo, key.hi),
                             st.sampled_from([key.lo, key.hi]))
        if isinstance(key, EnumKey):
            return st.sampled_from(key.choices)
        if isinstance(key, PolicyKey):
            return names
        if isinstance(key, SpliceKey):
            ranges = st.tuples(st.integers(0, 40), st.integers(0, 40)).map(lambda r: f"@{min(r)}-{max(r)}")
            return st.builds(str.__add__, st.sampled_from(SPLICES), st.one_of(st.just(""), ranges))
        if isinstance(key, RowsKey):
            return st.lists(st.integers(0, 4 * 4096), max_size=64)
        raise AssertionError(f"no strategy for request key {key.name}")

    valid_objects = st.fixed_dictionaries({}, optional={k.name: valid(k) for k in REQUEST_KEYS})
    # Each key with a value of any type, or in range, beside unknown keys.
    mixed_objects = st.dictionaries(
        st.one_of(st.sampled_from([k.name for k in REQUEST_KEYS]), st.text(max_size=20)),
        st.one_of(any_json, *[valid(k) for k in REQUEST_KEYS]), max_size=len(REQUEST_KEYS) + 2,
    )
    one_wrong = st.builds(
        lambda base, key, value: {**base, key: value},
        valid_objects, st.sampled_from([k.name for k in REQUEST_KEYS]), any_json,
    )
    shorthands = st.one_of(st.booleans(), st.sampled_from(ARMS), names)
    return st.one_of(valid_objects, one_wrong, mixed_objects, shorthands, any_json)


def draw_examples(strategy, n: int, seed: int) -> list[Any]:
    """``n`` examples of ``strategy`` (fewer only if Hypothesis runs out of distinct ones), fixed by ``seed``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fix_seed

    drawn: list[Any] = []

    @fix_seed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value):
        drawn.append(value)

    collect()
    return drawn[:n]


def request_bodies(n: int, seed: int, shape: Shape, policy_names: Sequence[str] = ()) -> list[dict]:
    """``n`` ``/generate`` bodies whose ``custom_params["ridgefill"]`` is fuzzed (prompt and decoding are
    ordinary: 1 to 3 chunks of random ids, 1 or 2 greedy tokens)."""
    import random

    values = draw_examples(_strategies(policy_names), n, seed)
    rng = random.Random(seed)
    bodies = []
    for value in values:
        n_tokens = rng.randint(1, min(3 * shape.chunk, shape.longest))
        ids = [rng.randrange(shape.token_low, shape.token_high) for _ in range(n_tokens)]
        sampling = {"max_new_tokens": rng.randint(1, 2), "temperature": 0, "ignore_eos": True,
                    "custom_params": {"ridgefill": value}}
        bodies.append({"input_ids": ids, "sampling_params": sampling})
    return bodies


def policy_texts(n: int, seed: int) -> list[str]:
    from ..policy.strategies import policy_texts as texts

    return draw_examples(texts, n, seed)


# ----------------------------------------------------------------------------- policies in-process
def check_policy_text(text: str, maps_dir: pathlib.Path | None, workdir: pathlib.Path) -> tuple[str, str | None]:
    """``("ok" | "policy_error", name)`` for a text the tools handle, ``("failure: ...", name)`` otherwise;
    ``name`` is the policy's name when it parses."""
    from ..policy import PolicyError, compile_policy, format_policy, parse_policy
    from ..cli import main as cli_main
    from ..policy.manifest import read_maps_facts

    name = None
    try:
        try:
            policy = parse_policy(text, "fuzz.rfpolicy")
        except PolicyError:
            verdict = "policy_error"
        else:
            name = policy.name
            if parse_policy(format_policy(policy)) != policy:
                return "failure: format then parse gives another policy", name
            maps = read_maps_facts(maps_dir).maps_info() if maps_dir is not None else None
            try:
                compile_policy(policy, maps=maps, defer_split=maps is None)
                verdict = "ok"
            except PolicyError:
                verdict = "policy_error"
        path = workdir / "fuzz.rfpolicy"
        path.write_text(text, encoding="utf-8")
        argv = ["policy", "check", str(path)] + (["--maps", str(maps_dir)] if maps_dir is not None else [])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                code = cli_main(argv)
            except SystemExit as stop:  # argparse: the command line itself was refused
                return f"failure: policy check stopped ({stop.code}): {err.getvalue()[-200:]}", name
        if code not in (0, 1):
            return f"failure: policy check exited {code}", name
        if (code == 0) != (verdict == "ok"):
            return f"failure: policy check exited {code} where the compiler said {verdict}", name
        return verdict, name
    except Exception as err:  # noqa: BLE001 - the point: anything but PolicyError is a finding
        return f"failure: {type(err).__name__}: {err}"[:300], name


# ----------------------------------------------------------------------------- sending
def _post(url: str, body: dict, timeout: float = 120.0) -> tuple[int | None, str]:
    import requests

    try:
        # Serialised here: requests refuses NaN, which is exactly what a client may send.
        data = json.dumps(body, allow_nan=True)
        resp = requests.post(url.rstrip("/") + "/generate", data=data, timeout=timeout,
                             headers={"content-type": "application/json"})
    except requests.RequestException as err:
        return None, type(err).__name__
    return resp.status_code, resp.text[:300]


def send_batches(url: str, bodies: Sequence[dict], clients: int, deadline: float,
                 healthy: Callable[[], bool]) -> dict:
    """Post ``bodies`` in batches of :data:`BATCH` from ``clients`` threads, checking ``healthy()`` after
    each batch; stops at the deadline or when the server is unhealthy."""
    statuses: dict[str, int] = {}
    server_errors, unhealthy_after = [], None
    sent = 0
    for start in range(0, len(bodies), BATCH):
        if time.monotonic() > deadline:
            break
        batch = bodies[start : start + BATCH]
        with ThreadPoolExecutor(max_workers=clients, thread_name_prefix="soak-fuzz") as pool:
            results = list(pool.map(lambda b: _post(url, b), batch))
        for body, (status, text) in zip(batch, results):
            key = str(status) if status is not None else f"client:{text}"
            statuses[key] = statuses.get(key, 0) + 1
            if status is None or status >= 500 or status < 200 or 300 <= status < 400:
                server_errors.append({"status": status, "response": text, "ridgefill": _shown(body)})
        sent += len(batch)
        if not healthy():
            unhealthy_after = sent
            break
    return {"sent": sent, "by_status": dict(sorted(statuses.items())), "server_errors": len(server_errors),
            "first_server_errors": server_errors[:SHOWN], "unhealthy_after": unhealthy_after}


def _shown(body: dict) -> str:
    value = body["sampling_params"]["custom_params"]["ridgefill"]
    text = json.dumps(value, allow_nan=True, default=repr)
    return text if len(text) <= 300 else text[:299] + "…"


def run_fuzz(url: str, *, bodies: int, policies: int, seed: int, shape: Shape, clients: int, deadline: float,
             healthy: Callable[[], bool], maps_dir: pathlib.Path | None, policy_names: Sequence[str] = ()) -> dict:
    """The ``fuzz`` section of the summary."""
    t0 = time.monotonic()
    drawn = request_bodies(bodies, seed, shape, policy_names)
    request_part = {"generated": len(drawn), **send_batches(url, drawn, clients, deadline, healthy)}

    texts = policy_texts(policies, seed)
    verdicts: dict[str, int] = {}
    failures, name_bodies = [], []
    with tempfile.TemporaryDirectory(prefix="soak-policy-") as tmp:
        for text in texts:
            verdict, name = check_policy_text(text, maps_dir, pathlib.Path(tmp))
            kind = "failure" if verdict.startswith("failure") else verdict
            verdicts[kind] = verdicts.get(kind, 0) + 1
            if kind == "failure":
                failures.append({"text": text[:300], "verdict": verdict})
            sampling = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True,
                        "custom_params": {"ridgefill": {"policy": name if name is not None else text}}}
            name_bodies.append({"input_ids": list(range(shape.token_low, shape.token_low + shape.tail + 5)),
                                "sampling_params": sampling})
    policy_part = {"generated": len(texts), "in_process": verdicts, "in_process_failures": len(failures),
                   "first_in_process_failures": failures[:SHOWN],
                   "as_request_policy": send_batches(url, name_bodies, clients, deadline, healthy)}
    server_errors = request_part["server_errors"] + policy_part["as_request_policy"]["server_errors"]
    unhealthy = sum(part["unhealthy_after"] is not None for part in (request_part, policy_part["as_request_policy"]))
    # server_errors: answers that were neither 2xx nor 4xx (5xx, or no answer at all); failures: the rest.
    return {"request_bodies": request_part, "policy_texts": policy_part, "server_errors": server_errors,
            "failures": len(failures) + unhealthy, "wall_s": round(time.monotonic() - t0, 1)}

