"""Every import of the package respects the layers ``docs/ARCHITECTURE.md`` declares (its table is the one
declaration): a room imports its own layer and the layers below, and the one import up is the one it names."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "ARCHITECTURE.md"
# Roots of the package's modules: sgl_ridgefill/ itself, and the top-level folders it imports under its name.
ROOTS = {"sgl_ridgefill": REPO / "sgl_ridgefill", "sgl_ridgefill.selectors": REPO / "selectors",
         "sgl_ridgefill.kernels": REPO / "kernels"}
ALLOWED_UP = {("sgl_ridgefill/runtime/factory.py", "gpu_check/")}


def declared_layers(text: str) -> dict[str, int]:
    """``room -> layer`` from the ``| layer | rooms | may import |`` table."""
    rooms: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^\| (\d+) \| (.+?) \| .+ \|$", line)
        if m:
            for room in re.findall(r"`([^`]+)`", m.group(2)):
                rooms[room] = int(m.group(1))
    return rooms


def room_of(module: str) -> str | None:
    """The room of ``sgl_ridgefill.x.y``: ``x/`` for a folder, ``x.py`` for a file, ``__init__.py`` for the
    package itself; ``None`` outside the package."""
    parts = module.split(".")
    if parts[0] != "sgl_ridgefill":
        return None
    if len(parts) == 1:
        return "__init__.py"
    here = REPO / "sgl_ridgefill" / parts[1]
    if here.is_dir():
        return f"{parts[1]}/"
    return f"{parts[1]}.py" if here.with_suffix(".py").is_file() else "__init__.py"  # else a name the package defines


def modules() -> list[tuple[str, pathlib.Path]]:
    """``(dotted name, path)`` of every module of the package."""
    found = []
    for prefix, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            if prefix == "sgl_ridgefill" and path.relative_to(root).parts[0] in ("selectors", "kernels"):
                continue
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((prefix, *parts))
            found.append((name.removesuffix(".__init__"), path))
    return found


def imports_of(name: str, path: pathlib.Path) -> list[tuple[str, int]]:
    """``(imported module, line)`` of every import in the file, relative ones resolved; ``from p import x``
    counts as ``p.x`` (``x`` may be a module)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module) if p)
            out += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return out


def violations(layers: dict[str, int]) -> list[str]:
    found = []
    for name, path in modules():
        src = room_of(name)
        rel = str(path.relative_to(REPO))
        for target, line in imports_of(name, path):
            dst = room_of(target)
            if dst is None or dst == src:
                continue
            if dst not in layers or src not in layers:
                found.append(f"{rel}:{line}: {src if src not in layers else dst} is in no layer of {DOC.name}")
            elif layers[dst] > layers[src] and (rel, dst) not in ALLOWED_UP:
                found.append(f"{rel}:{line}: imports {target} (layer {layers[dst]}) from layer {layers[src]}")
    return found


def test_the_table_names_every_room():
    layers = declared_layers(DOC.read_text())
    assert len(set(layers.values())) == 7, layers
    missing = sorted({room_of(name) for name, _ in modules()} - set(layers))
    assert missing == [], f"rooms in no layer of {DOC.name}: {missing}"


def test_no_import_runs_up_a_layer():
    assert violations(declared_layers(DOC.read_text())) == []


def test_the_check_catches_an_import_up():
    layers = declared_layers(DOC.read_text())
    layers["arch.py"] = 3  # as if arch.py sat above settings: vocabulary still fine, settings' imports not
    layers["settings.py"] = 1
    found = violations(layers)
    assert any("sgl_ridgefill/settings.py" in v and "from layer 1" in v for v in found), found


@pytest.mark.parametrize("module, room", [("sgl_ridgefill", "__init__.py"), ("sgl_ridgefill.runtime.state", "runtime/"),
                                          ("sgl_ridgefill.arch", "arch.py"), ("sgl_ridgefill.kernels.quant", "kernels/"),
                                          ("sgl_ridgefill.__version__", "__init__.py"),
                                          ("torch", None)])
def test_room_of(module, room):
    assert room_of(module) == room
