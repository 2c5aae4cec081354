"""Every runbook section the code and docs send an operator to exists, by its name (numbers shift)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def runbook_sections_of_errors() -> dict[str, str]:
    """The sections error classes carry as data (`runbook`), for the messages errors.see_runbook renders."""
    from tests.unit.test_errors import defined_errors

    return {e.__qualname__: e.runbook for e in defined_errors() if getattr(e, "runbook", None)}


def test_every_runbook_section_named_exists() -> None:
    headings = set(re.findall(r"^## (.+)$", (ROOT / "docs" / "runbook.md").read_text(), re.M))
    files = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    named, unknown = 0, []
    for name in files:
        path = ROOT / name
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        unknown += [f"{name}: by number: {m}" for m in re.findall(r"(?:runbook\S*,? section|runbook §) ?\d+", text)]
        for title in re.findall(r"(?:runbook(?:\.md)?,? (?:section )?|section )'([^'\"\n]+)'", text):
            named += 1
            if title not in headings:
                unknown.append(f"{name}: {title!r}")
    named += len(runbook_sections_of_errors())
    unknown += [f"{kind}.runbook: {title!r}" for kind, title in runbook_sections_of_errors().items() if title not in headings]
    assert named > 10 and unknown == []
    assert not [h for h in headings if re.match(r"\d+\.", h)], "runbook sections are named, not numbered"
