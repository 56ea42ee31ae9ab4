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


def build_strict(config_file: Path, site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` as the docs say to run it (no ``--quiet``: strict mode's warnings are
    what fails it, and they must show), from the folder of ``config_file``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config_file),
                           "--site-dir", str(site_dir)],
                          cwd=config_file.parent, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    done = build_strict(ROOT / "mkdocs.yml", out)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, log
    return out


def test_the_strict_build_fails_on_a_warning(tmp_path: Path) -> None:
    """The check above can fail: the same command on a one-page site with a broken link exits non-zero."""
    pytest.importorskip("mkdocs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[gone](missing.md)\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text("site_name: canary\n", encoding="utf-8")
    done = build_strict(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stdout + done.stderr


@pytest.mark.slow
def test_results_files_link_the_site_pages(site: Path) -> None:
    """A results file links a page as the repository holds it (../../docs/PAGE.md); on the site the
    link reaches that page."""
    linking = [p for p in sorted((ROOT / RESULTS_PATH).glob("*.md"))
               if "../../docs/" in p.read_text(encoding="utf-8")]
    assert linking, "no results file links a docs page: this test checks nothing"
    for path in linking:
        html = (site / "results" / path.stem / "index.html").read_text(encoding="utf-8")
        for target in re.findall(r'href="(\.\./[^"#]*)', html):
            page = (site / "results" / path.stem / target).resolve()
            assert (page / "index.html").is_file() or page.is_file(), f"{path.name}: {target} is not on the site"


@pytest.mark.slow
def test_site_builds_strict(site: Path) -> None:
    for page in ("index.html", "reference/commands/index.html", "reference/configuration/index.html",
                 "decisions/index.html", "architecture/index.html"):
        assert (site / page).is_file(), page


@pytest.mark.slow
def test_command_reference_lists_every_command(site: Path) -> None:
    import argparse

    html = (site / "reference" / "commands" / "index.html").read_text(encoding="utf-8")
    parser = _hook()._parser()
    commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    for name in commands:
        assert f'id="{name}"' in html, name


@pytest.mark.slow
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


@pytest.mark.slow
def test_code_blocks_of_the_home_page_and_the_command_reference_fit_the_text_column(site: Path) -> None:
    """Issue 79: the pipeline diagram of the home page was clipped (a 100-column block in a text column
    that shows about 75 at 1280 pixels); the command reference's usage, example and exit-code blocks
    are wrapped to the same width (checked by eye in a headless browser's screenshot too)."""
    import html as html_module

    width = _hook().CODE_WIDTH
    for page in ("index.html", "reference/commands/index.html"):
        text = (site / page).read_text(encoding="utf-8")
        blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", text, re.S)
        assert blocks, page
        for block in blocks:
            for line in html_module.unescape(re.sub(r"<[^>]+>", "", block)).splitlines():
                assert len(line) <= width, f"{page}: {line!r} is wider than {width} columns"


@pytest.mark.slow
def test_setting_names_in_tables_break_only_after_a_dot_or_underscore(site: Path) -> None:
    """Issue 79: setting names were broken mid-word (``data.on_ba d_file``): the theme lets code break
    anywhere; the site's CSS forbids that in tables and the generated cells offer a break after each
    dot and underscore instead."""
    hook = _hook()
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"table:not\(\[class\]\) code \{[^}]*word-break: normal", css)
    assert "stylesheets/extra.css" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    html = (site / "reference" / "configuration" / "index.html").read_text(encoding="utf-8")
    assert hook.breakable_code("data.on_bad_file") == "<code>data.<wbr>on_<wbr>bad_<wbr>file</code>"
    for section, key, _, _ in hook.config_settings():
        assert hook.breakable_code(f"{section}.{key}") in html, f"{section}.{key}"
    assert hook.wrapped_command("x --a b  # or: y") == "# or: y\nx --a b"
