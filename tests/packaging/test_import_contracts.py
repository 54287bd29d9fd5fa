"""Every module of the package is named in an import contract in pyproject.toml, so none can grow imports that no
contract checks (tap/relay/fallback_watch.py once sat in none). Named means: a layer of a layers contract (with its
container, if any), a source of a forbidden contract, or a module of an independence contract. A package named covers
its own __init__ and, where it holds one module only, that module (no sibling to order it against)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "specdecode_exporter"


def contracts() -> list[dict[str, Any]]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(config["tool"]["importlinter"]["contracts"])


def package_modules() -> set[str]:
    """Dotted names of every module and subpackage under src/specdecode_exporter, the root package left out."""
    names: set[str] = set()
    for path in (ROOT / "src" / PACKAGE).rglob("*.py"):
        parts = path.relative_to(ROOT / "src").with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if len(parts) > 1:
            names.add(".".join(parts))
    return names


def layer_names(layer: str) -> list[str]:
    """The modules of one layer: siblings joined by `|` (independent) or `:` (not), an optional one in brackets."""
    return [name.strip().strip("()") for name in re.split(r"[|:]", layer) if name.strip()]


def named_modules(contract: dict[str, Any]) -> set[str]:
    """What a contract constrains: its layers (under each container), its sources, its independent modules."""
    layers = [name for layer in contract.get("layers", []) for name in layer_names(layer)]
    containers = contract.get("containers", [])
    named = {f"{container}.{name}" for container in containers for name in layers} if containers else set(layers)
    return named | set(contract.get("source_modules", [])) | set(contract.get("modules", []))


def unnamed_modules(modules: set[str], named: set[str]) -> list[str]:
    def parent(name: str) -> str:
        return name.rpartition(".")[0]

    def covered(name: str) -> bool:
        only_child = sum(parent(other) == parent(name) for other in modules) == 1
        return name in named or (only_child and parent(name) in named)

    return sorted(name for name in modules if not covered(name))


def test_every_module_is_named_in_a_contract() -> None:
    named = set().union(*(named_modules(contract) for contract in contracts()))
    unnamed = unnamed_modules(package_modules(), named)
    assert not unnamed, f"modules in no import contract (pyproject.toml [tool.importlinter]): {unnamed}"


def test_every_module_a_contract_names_exists() -> None:
    """A contract keeps up with a move: each of the package's modules it names (forbidden ones included) is there."""
    named = set().union(*(named_modules(c) | set(c.get("forbidden_modules", [])) for c in contracts()))
    ours = {name for name in named if name.split(".")[0] == PACKAGE}
    assert not sorted(ours - package_modules()), sorted(ours - package_modules())
