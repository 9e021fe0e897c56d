"""The docs against the code, so that they cannot drift: every flag of trainer/flags.py in
docs/flags.md with its default, choices, range and help; every relative link of README.md,
docs/*.md and bench/HISTORY.md to an existing file and heading; every path of trainer/,
deploy/, bench/, tests/ and examples/ and every `trainer.x`/`deploy.x` module the pages name.
Reads files and imports trainer.flags only (no TensorFlow; tests/conftest.py loads it for the
other tests, which `pytest --noconftest tests/test_docs.py` skips: about a second).

A page may name what is gone only on purpose, listed in REMOVED."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from trainer import flags

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "HISTORY.md", *(ROOT / "docs").glob("*.md")])
# What a page names on purpose though it is gone: the history of what was tried and removed.
REMOVED = {"bench/HISTORY.md": {"bench/bagging.py", "bench/results/bagging.json"}}

FENCED = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path of the repo's folders, but not the unit "examples/s" (examples per second).
PATH = re.compile(r"(?<![\w./-])((?:trainer|deploy|bench|tests|examples)/(?!s\b)[\w./<>*-]*[\w/*])")
MODULE = re.compile(r"(?<![\w./-])((?:trainer|deploy)(?:\.[A-Za-z_]\w*)+)(?![\w-])")
FILE_SUFFIXES = {"md", "py", "yaml", "json", "ipynb", "toml"}  # deploy.md is a page
FLAG_ROW = re.compile(r"^\| `--(\w+)` \| ([^|]*) \| (.*) \|$", re.M)


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@functools.cache
def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


@functools.cache
def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lowercase, punctuation but hyphens
    dropped, spaces made hyphens, a repeated one numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCED.sub("", text(page)), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def documented_flags() -> dict[str, tuple[str, str]]:
    """{flag: (default column, description)} of docs/flags.md's tables."""
    rows = FLAG_ROW.findall(text(ROOT / "docs" / "flags.md"))
    return {flag: (default.strip(), description) for flag, default, description in rows}


def shown_default(flag: flags.Flag) -> str:
    """A flag's default as the table shows it: `value` (lists joined by commas, booleans in
    lowercase), empty when unset."""
    value = flag.default
    if value is None or value == []:
        return ""
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, list):
        value = ",".join(value)
    return f"`{value}`"


@pytest.mark.parametrize("flag", flags.FLAGS, ids=lambda f: f.name)
def test_every_flag_is_in_flags_md_as_defined(flag: flags.Flag):
    rows = documented_flags()
    assert flag.name in rows, f"docs/flags.md has no row for --{flag.name}"
    default, description = rows[flag.name]
    assert default == shown_default(flag), f"--{flag.name}'s default"
    plain = description.replace("`", "")  # the help may quote `*.jsonl` and the like
    assert flag.help in plain, f"--{flag.name}'s help, as trainer/flags.py has it"
    for choice in flag.choices:
        assert f"`{choice}`" in description, f"--{flag.name}'s choice {choice}"
    if flag.range is not None:
        assert f"Must be {flag.range}." in description, f"--{flag.name}'s range"


def test_flags_md_documents_no_other_flag():
    unknown = sorted(set(documented_flags()) - set(flags.BY_NAME))
    assert not unknown, f"docs/flags.md documents flags trainer/flags.py lacks: {unknown}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_relative_links_resolve(page: Path):
    broken = []
    for target in LINK.findall(FENCED.sub("", text(page))):
        if re.match(r"[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading")
    assert not broken, f"{name(page)}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_named_paths_exist(page: Path):
    allowed = REMOVED.get(name(page), set())
    missing = []
    for path in set(PATH.findall(text(page))) - allowed:
        if "<" in path:  # a pattern, trainer/input/formats/<name>.py: its folder
            found = (ROOT / path.split("<")[0]).parent.is_dir()
        elif "*" in path:
            found = any(ROOT.glob(path))
        else:
            found = (ROOT / path).exists()
        if not found:
            missing.append(path)
    assert not missing, f"{name(page)} names paths that do not exist: {sorted(missing)}"


def _resolves(dotted: str) -> bool:
    """Whether `trainer.a.b.Name` is a module, or a module and a name its source holds."""
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:end])
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.exists():
                rest = parts[end:]
                return (
                    not rest
                    or re.search(rf"\b{re.escape(rest[0])}\b", source.read_text()) is not None
                )
    return False


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_named_modules_exist(page: Path):
    named = {m for m in MODULE.findall(text(page)) if m.rsplit(".", 1)[1] not in FILE_SUFFIXES}
    missing = sorted(m for m in named if not _resolves(m))
    assert not missing, f"{name(page)} names modules that do not exist: {missing}"
