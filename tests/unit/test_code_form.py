"""Comments and docstrings in handler/ say what and why, never when or on which card: no GPU
model names, no ``benchmarks/`` paths, no "as before". Those facts belong to the performance
docs and the findings log. Read from the source; nothing is imported.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

HANDLER = Path(__file__).resolve().parents[2] / "handler"

GPU = re.compile(
    r"\b(?:[HAB][1-8]00|A[1-4]0G?|A[4-6]000|H20|L4|L[24]0S?|G[HB]200|[VP]100|T4|K80|MI\d{3}X?"
    r"|RTX|GeForce|Quadro|Tesla)\b"
)
RULES = {
    "names a GPU model": GPU,
    "cites a benchmarks/ path": re.compile(r"\bbenchmarks/"),
    'says "as before"': re.compile(r"\bas before\b", re.IGNORECASE),
}
# Comments of the other languages: // and /* */ (Java, JavaScript, CSS), <!-- --> (HTML, XML).
_LINE_COMMENT = re.compile(r"(?<![:\"'\\])//[^\n]*")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/|<!--.*?-->", re.DOTALL)


def _python_notes(text: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each comment and docstring."""
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                yield body[0].lineno, body[0].value.value


_COMMENTS = {
    ".java": (_BLOCK_COMMENT, _LINE_COMMENT),
    ".js": (_BLOCK_COMMENT, _LINE_COMMENT),
    ".css": (_BLOCK_COMMENT,),
    ".html": (_BLOCK_COMMENT,),
    ".xml": (_BLOCK_COMMENT,),
}


def _other_notes(text: str, suffix: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each comment of a Java, JavaScript, CSS, HTML or XML file."""
    for pattern in _COMMENTS[suffix]:
        for match in pattern.finditer(text):
            yield text.count("\n", 0, match.start()) + 1, match.group()


def notes(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment line and docstring line of ``path``."""
    text = path.read_text(encoding="utf-8")
    found = _python_notes(text) if path.suffix == ".py" else _other_notes(text, path.suffix)
    for first, note in found:
        for offset, line in enumerate(note.splitlines()):
            yield first + offset, line


def _where(path: Path) -> str:
    return str(path.relative_to(HANDLER.parent) if path.is_relative_to(HANDLER.parent) else path)


def offenders(paths: list[Path]) -> list[str]:
    """``file:line: rule: text`` of each comment or docstring line that breaks a rule."""
    return [
        f"{_where(path)}:{line}: {why}: {note.strip()}"
        for path in paths
        for line, note in notes(path)
        for why, pattern in RULES.items()
        if pattern.search(note)
    ]


def _files() -> list[Path]:
    return sorted(
        path
        for path in HANDLER.rglob("*")
        if (path.suffix == ".py" or path.suffix in _COMMENTS)
        and not any(part.endswith(".egg-info") for part in path.parts)
    )


@pytest.mark.parametrize(
    ("note", "found"),
    [
        ("# measured on an H200", True),
        ("# 0.9 x on the A100 and L40S", True),
        ("# see benchmarks/decode/results.md", True),
        ("# compiled at launch, as before", True),
        ("# one H2 heading per section, an L2 cache line, 128 rows", False),
        ("# the batch-1 step's projections", False),
        ("# noqa: B018 (a lint code, not a card)", False),
    ],
)
def test_the_rules_tell_offenders(note: str, found: bool, tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text(f'"""A module."""\n\nX = 1  {note}\n', encoding="utf-8")
    assert bool(offenders([path])) is found


def test_docstrings_and_other_languages_are_read(tmp_path: Path) -> None:
    """Docstring lines, Java's block and line comments and XML comments count; code does not."""
    python = tmp_path / "a.py"
    python.write_text('def f() -> None:\n    """Two lines,\n    as before."""\n', "utf-8")
    java = tmp_path / "B.java"
    java.write_text('/**\n * on an H100\n */\nclass B { String u = "http://x"; } // T4\n', "utf-8")
    xml = tmp_path / "c.xml"
    xml.write_text("<a>H100</a>\n<!-- see\n benchmarks/x -->\n", "utf-8")
    lines = [found.split(": ")[0] for found in offenders([python, java, xml])]
    assert lines == [f"{python}:3", f"{java}:2", f"{java}:4", f"{xml}:3"]


def test_comments_say_what_and_why_never_when() -> None:
    files = _files()
    assert any(path.name == "hunyuan_mt_handler.py" for path in files)
    found = offenders(files)
    assert not found, "comments and docstrings to move to the docs:\n" + "\n".join(found)
