"""The repo's docs are the only docs code may cite: every `docs/<page>.md` (and `#section`) named in tx/, tests/,
scripts/ or CI exists in this repository, nothing points at design notes outside it, and the links between the
README and the pages of docs/ resolve.

A section is cited by its heading's anchor (`docs/engines.md#pause-and-resume`), never by a number.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("tx", "tests", "scripts", ".ci")
SUFFIXES = {".py", ".proto", ".sh", ".toml", ".cfg", ".ini", ".yaml", ".yml", ""}
CITATION = re.compile(r"(?<![\w/.])docs/([\w.-]+\.md)(#[\w-]+)?")
OUTSIDE = re.compile(r"\.\./shared|/work/shared|shared/docs")
NUMBERED = re.compile(r"(?:\.md|protocol)`?\s*§|§\s*\d")
# Still cites a section by number; its engine-contract text moves into docs/engines.md (issue 18, item 7).
LINK = re.compile(r"\]\(([^)\s]+)\)")


def source_files() -> Iterator[Path]:
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                if not path.name.endswith("_pb2.py"):
                    yield path


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add("#" + re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return
    yield from enumerate(text.splitlines(), start=1)


def test_cited_docs_exist_in_the_repo() -> None:
    missing = []
    for path in source_files():
        for number, line in lines(path):
            for page, anchor in CITATION.findall(line):
                target = ROOT / "docs" / page
                if not target.is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: docs/{page} is not in the repo")
                elif anchor and anchor not in anchors(target):
                    missing.append(f"{path.relative_to(ROOT)}:{number}: docs/{page} has no section {anchor}")
    assert not missing, "\n".join(missing)


def test_nothing_cites_docs_outside_the_repo_or_sections_by_number() -> None:
    found = []
    for path in source_files():
        relative = str(path.relative_to(ROOT))
        if relative == "tests/test_docs.py":
            continue
        for number, line in lines(path):
            if OUTSIDE.search(line):
                found.append(f"{relative}:{number}: cites a path outside the repo")
            if NUMBERED.search(line):
                found.append(f"{relative}:{number}: cites a section by number (use docs/<page>.md#<section>)")
    assert not found, "\n".join(found)


def test_links_between_the_readme_and_docs_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in lines(page):
            for link in LINK.findall(line):
                if link.startswith(("http://", "https://", "mailto:")):
                    continue
                file, _, anchor = link.partition("#")
                target = (page.parent / file).resolve() if file else page
                if not target.exists():
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {link} does not exist")
                elif anchor and target.suffix == ".md" and f"#{anchor}" not in anchors(target):
                    broken.append(f"{page.relative_to(ROOT)}:{number}: {link} names no section of {file or page.name}")
    assert not broken, "\n".join(broken)
