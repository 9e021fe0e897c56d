"""The house rules a reader relies on, checked: deploy/'s top level holds its commands (each a
`python -m deploy.NAME` with a `main`) and the notebook API, over its rooms; no module of
deploy/ is over 500 lines; no function of trainer/ or deploy/ is over 80 lines (data tables
excepted, by name). The layers themselves are import-linter's contracts (pyproject.toml)."""

from __future__ import annotations

import ast
import re

import pytest

from tests.support import REPO

MAX_MODULE_LINES = 500  # deploy/
MAX_FUNCTION_LINES = 80  # trainer/ and deploy/, the docstring included
# Functions that are data tables (one entry a line), allowed past the limit: none today.
DATA_TABLES: frozenset[str] = frozenset()
ROOMS = {"batch_prediction", "cloud", "local", "serving", "vertex"}
NOT_COMMANDS = {"__init__", "sdk"}


def _python_files(package: str) -> list:
    return sorted((REPO / package).rglob("*.py"))


def _deploy_layers() -> list[str]:
    """The layers of the contract whose container is deploy (a TOML list of strings, read
    without tomllib, which Python 3.10 lacks)."""
    text = (REPO / "pyproject.toml").read_text()
    (layers,) = re.findall(r'containers = \["deploy"\]\s*layers = (\[.*?\])', text, re.S)
    return ast.literal_eval(layers)


def test_deploys_top_level_is_its_commands_and_the_notebook_api_over_its_rooms():
    top = {p.stem for p in (REPO / "deploy").glob("*.py")}
    rooms = {p.parent.name for p in (REPO / "deploy").glob("*/__init__.py")}
    assert rooms == ROOMS
    layers = _deploy_layers()
    commands = {name.strip() for name in layers[1].split("|")}
    assert commands == top - NOT_COMMANDS, "a top-level module of deploy/ that is no command"
    assert {name.strip() for layer in layers[2:] for name in layer.split("|")} == ROOMS
    for name in commands:
        tree = ast.parse((REPO / "deploy" / f"{name}.py").read_text())
        defined = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        } | {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        assert "main" in defined, f"deploy/{name}.py has no main: not a command"


@pytest.mark.parametrize("path", _python_files("deploy"), ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_of_deploy_is_over_500_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(REPO)}: {lines} lines"


def test_no_function_of_trainer_or_deploy_is_over_80_lines():
    long = []
    for path in _python_files("trainer") + _python_files("deploy"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES and node.name not in DATA_TABLES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines})")
    assert long == []
