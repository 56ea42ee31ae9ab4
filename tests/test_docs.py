"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link or anchor fails), the
README stays a short user's guide, figures and results paths stay out of the code and the configs (they
belong in docs/decisions.md), and the generated configuration reference lists every setting."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOK = ROOT / "docs" / "hooks" / "reference.py"
README_MAX_LINES = 250
RESULTS_PATH = "benchmarks/results"
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def _hook():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", HOOK)
    module = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)  # registered first: its dataclass looks its module up
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_site_builds_strict(site: Path) -> None:
    for page in ("index.html", "reference/commands/index.html", "reference/configuration/index.html",
                 "decisions/index.html", "architecture/index.html"):
        assert (site / page).is_file(), page


def test_command_reference_lists_every_command(site: Path) -> None:
    import argparse

    html = (site / "reference" / "commands" / "index.html").read_text(encoding="utf-8")
    parser = _hook()._parser()
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    for name in commands:
        assert f'id="{name}"' in html, name


def test_configuration_reference_lists_every_setting(site: Path) -> None:
    html = (site / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    settings = _hook().config_settings()
    assert len(settings) > 50
    for section, key, _, doc in settings:
        assert f'id="{section}.{key}"' in html, f"{section}.{key} missing from the configuration reference"
        assert doc.comment, f"{section}.{key} has no comment in its dataclass (the reference's meaning)"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_no_results_paths_in_readme_configs_or_code() -> None:
    files = [ROOT / "README.md", *sorted((ROOT / "pipelines" / "configs").glob("*.toml")),
             *sorted((ROOT / "pipelines").rglob("*.py"))]
    cited = [str(p.relative_to(ROOT)) for p in files if RESULTS_PATH in p.read_text(encoding="utf-8")]
    assert not cited, f"{RESULTS_PATH} cited in {cited}: link results from docs/decisions.md instead"


def test_no_dates_in_configs_or_docstrings() -> None:
    dated = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "pipelines" / "configs").glob("*.toml"))
             if DATE.search(p.read_text(encoding="utf-8"))]
    for path in sorted((ROOT / "pipelines").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=False)
                if doc and DATE.search(doc):
                    dated.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}")
    assert not dated, f"dates in {dated}: they belong in docs/decisions.md"
