"""Each target's descriptor owns its product's facts: outside `targets/` no module names a product, and
the registry, config, CLI and value checks read descriptors (streaming_sink/targets/descriptor.py)."""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import pytest

from streaming_sink import targets
from streaming_sink.targets import DESCRIPTORS, REGISTRY, descriptor_for, register, target_from_url, url_forms
from streaming_sink.targets.base import ExpiryKind, SupportsCreateTable
from streaming_sink.targets.memory import MemoryTarget

ROOT = Path(__file__).resolve().parents[2]
PRODUCT_WORDS = re.compile(r"\b(" + "|".join(sorted({word for d in DESCRIPTORS for word in (
    d.product, d.display_name, *(s for s, transport in d.schemes.items() if s not in ("http", "https")))})) + r")\b",
    re.IGNORECASE)


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module that are not docstrings (prose may name products; code may not)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and not node.value.startswith("streaming_sink.targets.")]  # the façade's lazy names of the target modules


def test_no_module_outside_targets_names_a_product() -> None:
    outside = [p for folder in (ROOT / "streaming_sink", ROOT / "state") for p in folder.rglob("*.py")
               if "targets" not in p.relative_to(ROOT).parts]
    assert len(outside) > 20
    named = [f"{path.relative_to(ROOT)}:{line}: {text[:80]!r}" for path in outside for line, text in _code_strings(path)
             if PRODUCT_WORDS.search(text)]
    assert named == []


@pytest.mark.parametrize("descriptor", DESCRIPTORS, ids=lambda d: d.product)
def test_a_descriptor_builds_its_own_target(descriptor: targets.TargetDescriptor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(targets.USER_ENV, "loader")
    scheme = next(s for s, transport in descriptor.schemes.items() if transport not in descriptor.path_transports)
    target = target_from_url(f"{scheme}://host:1", "db")
    assert target.kind == descriptor.product and descriptor_for(f"{scheme}://h:1") is descriptor
    assert isinstance(target, SupportsCreateTable) == descriptor.creates_tables
    assert descriptor.option_names and all(form.split("://")[0] in descriptor.schemes for form in descriptor.url_forms)
    assert [limit.kind for limit in target.expiry_limits()].count(ExpiryKind.PREPARED) == 1


def test_help_lists_every_target_url_form() -> None:
    from streaming_sink.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    help_of_recover = " ".join(build_parser()._subparsers._group_actions[0].choices["recover"].format_help().split())
    assert all(form in url_forms() for d in DESCRIPTORS for form in d.url_forms) and text
    assert url_forms() in help_of_recover


def test_a_registered_descriptor_takes_its_schemes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests put an instrumented target in place of a product's by registering it, not by patching the job."""
    monkeypatch.setattr(targets, "REGISTRY", dict(REGISTRY))
    built: list[str] = []

    def factory(url: str, database: str, user: str | None, password: str | None, options: object) -> MemoryTarget:
        built.append(url)
        return MemoryTarget()

    register(replace(DESCRIPTORS[0], product="memory", schemes={"mem": "mem"}, factory=factory))
    assert isinstance(target_from_url("mem://a,b", "db"), MemoryTarget) and built == ["mem://a,mem://b"]
    assert descriptor_for("mem://x").product == "memory" and "mem" not in REGISTRY


def test_the_configuration_guide_names_every_target_scheme() -> None:
    row = next(line for line in (ROOT / "docs" / "configuration.md").read_text().splitlines() if line.startswith("| `target.url`"))
    assert [scheme for scheme in REGISTRY if f"`{scheme}://" not in row and scheme not in ("http", "https")] == []
