"""The repository stands alone: nothing in it points outside it, and its own doc references resolve.

* No file the repository holds names an absolute path into the machine it was built on, or a
  sibling directory of the checkout (the protocol notes, design and reviews that once lived next
  to it): what the code relies on is in docs/.
* Every `docs/<name>.md` path named in a Python or Markdown file exists, and so does every relative
  Markdown link.
* Every citation of the form `docs/protocol.md, <Product>: <section>` names a heading of
  docs/protocol.md.

The files checked are those git tracks plus new ones it does not ignore (so a file is checked
before its first commit). Fast: reads about 150 text files, no network.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Built from pieces so that this file does not match its own patterns.
_OUTSIDE = [
    ("an absolute path into the build machine's work directory", re.compile(r"(?<![\w.~-])/" + "work/")),
    ("a path into a sibling 'shared' directory", re.compile(r"\.\./" + r"shared\b")),
    ("the outside protocol notes", re.compile("shared/" + r"protocol\.md")),
    ("the outside design notes", re.compile("shared/" + r"DESIGN\.md")),
    ("the outside reviews", re.compile("shared/" + r"reviews\b")),
]
# `docs/<name>.md` as a path of this repository: not inside a URL or another repository's path.
_DOCS_PATH = re.compile(r"(?<![\w./:@-])docs/[\w./-]*?\.md\b")
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
# The section name is captured by a lookahead (the rest of the line and the next one), so that
# citations close together are each checked.
_CITATION = re.compile(r"docs/protocol\.md,\s+(?:#\s*)?(?=((?:StarRocks|Doris|Common): [^\n]*(?:\n[^\n]*)?))")
_LINE_BREAK = re.compile(r"\s*\n\s*(?:#\s*)?")  # a citation may wrap onto the next comment line


def _repository_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True,
    ).stdout.decode()
    return [ROOT / name for name in sorted(set(listing.split("\0"))) if name and (ROOT / name).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    out = {}
    for path in _repository_files():
        text = _text(path)
        if text is not None:
            out[path] = text
    assert len(out) > 50, f"only {len(out)} text files found under {ROOT}; is this the repository?"
    return out


def _where(path: Path, text: str, offset: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}"


def test_no_file_points_outside_the_repository(texts: dict[Path, str]) -> None:
    found = [
        f"{_where(path, text, match.start())}: {what} ({match.group(0)!r})"
        for path, text in texts.items()
        for what, pattern in _OUTSIDE
        for match in pattern.finditer(text)
    ]
    assert not found, "files that rely on something outside the repository:\n" + "\n".join(found)


def test_docs_paths_named_in_code_and_docs_exist(texts: dict[Path, str]) -> None:
    missing = [
        f"{_where(path, text, match.start())}: {match.group(0)}"
        for path, text in texts.items() if path.suffix in (".py", ".md")
        for match in _DOCS_PATH.finditer(text)
        if not (ROOT / match.group(0)).is_file()
    ]
    assert not missing, "docs paths that do not exist:\n" + "\n".join(missing)


def test_relative_markdown_links_resolve(texts: dict[Path, str]) -> None:
    missing = []
    for path, text in texts.items():
        if path.suffix != ".md":
            continue
        for match in _MD_LINK.finditer(text):
            target = match.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # an anchor in the same page, or a URL
            if not (path.parent / target).exists():
                missing.append(f"{_where(path, text, match.start())}: {match.group(1)}")
    assert not missing, "relative links that do not resolve:\n" + "\n".join(missing)


def test_protocol_citations_name_existing_sections(texts: dict[Path, str]) -> None:
    protocol = ROOT / "docs" / "protocol.md"
    citing = {path: text for path, text in texts.items() if path.suffix in (".py", ".md") and path != protocol}
    if not any("docs/protocol.md" in text for text in citing.values()):
        pytest.skip("nothing cites docs/protocol.md")
    assert protocol.is_file(), "docs/protocol.md is cited but does not exist"
    headings = [line.lstrip("#").strip() for line in protocol.read_text().splitlines() if line.startswith("## ")]
    wrong = []
    for path, text in citing.items():
        for match in _CITATION.finditer(text):
            cited = _LINE_BREAK.sub(" ", match.group(1))
            if not any(cited.startswith(heading) for heading in headings):
                wrong.append(f"{_where(path, text, match.start())}: {cited[:80]}")
    assert not wrong, (
        "citations of docs/protocol.md sections that are not its '## ' headings:\n" + "\n".join(wrong)
    )
