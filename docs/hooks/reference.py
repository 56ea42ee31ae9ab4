"""MkDocs hook: the pages that are generated from the code, so they cannot drift from it.

* ``<!-- generated: commands -->`` in a page becomes the command reference, read from the argparse
  parser (``build_parser()`` of the command-line module);
* ``<!-- generated: configuration -->`` becomes the configuration reference, read from the typed
  config: every section's dataclass fields with their defaults, the allowed values from the field
  metadata, and their meaning from the comment above (or beside) each field in the source; then the
  per-collection overrides of ``base.toml`` and what each shipped config changes;
* ``<!-- generated: shipped-configs -->`` becomes the table of shipped configs alone, and
  ``<!-- generated: results-index -->`` a list of the results files;
* every file of ``benchmarks/results/`` is added to the site under ``results/`` (nothing is copied into
  ``docs/``), so a link such as ``results/<file>.md`` from a page is checked by ``mkdocs build --strict``;
  a results file links the pages as the repository holds them (``../../docs/<page>.md``, which a reader of
  the file on disk follows), and those links are mapped onto the site's pages (``../<page>.md``).

Modules are imported by name through the one table below (new package path first, then the old one).
Build with ``python -m mkdocs build --strict`` from the repository root, so that the checkout being
documented is the one imported; the build fails if it imports another checkout's ``pipelines``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import io
import logging
import re
import sys
import textwrap
import tokenize
import tomllib
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

# role -> module names tried in order (after the package move first, before it second)
MODULES: dict[str, tuple[str, ...]] = {
    "cli": ("pipelines.cli",),
    "settings": ("pipelines.config.settings", "pipelines.config"),
    "fields": ("pipelines.config.fields", "pipelines.models.fields"),
    "gbdt": ("pipelines.config.gbdt", "pipelines.models.gbdt_config"),
    "gnn": ("pipelines.config.gnn", "pipelines.models.gnn_config"),
}
RESULTS_DIR = "benchmarks/results"  # relative to the repository root (the folder of mkdocs.yml)
RESULTS_URI = "results"  # where its files appear in the site
CONFIGS_DIR = "pipelines/configs"  # the shipped TOML configs
PIPELINE_CLASS = "PipelineConfig"  # in the settings module: one field per TOML section
PER_COLLECTION = "collections"
COMMON_DESTS = ("verbosity",)  # -v/--verbose and -q/--quiet: every command's, listed once at the top
MARKER = re.compile(r"<!--\s*generated:\s*([a-z-]+)\s*-->")

log = logging.getLogger("mkdocs.hooks.reference")


def module(role: str) -> ModuleType:
    """The module of ``role`` in :data:`MODULES`: the first of its names that imports."""
    errors = []
    for name in MODULES[role]:
        try:
            found = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if role == "settings" and not hasattr(found, PIPELINE_CLASS):
            errors.append(f"{name}: no {PIPELINE_CLASS}")
            continue
        return found
    raise ImportError(f"no module for {role!r}: " + "; ".join(errors))


# ----------------------------------------------------------------------------- MkDocs events


def on_config(config: Any) -> Any:
    root = Path(config["config_file_path"]).resolve().parent
    package = Path(importlib.import_module("pipelines").__file__).resolve().parent
    if root not in package.parents:
        log.warning(f"the docs of {root} would describe the package at {package}: run "
                    "`python -m mkdocs build` from the repository root")
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    root = Path(config["config_file_path"]).resolve().parent
    for path in sorted((root / RESULTS_DIR).iterdir()):
        if path.is_file() and not path.name.startswith("."):
            files.append(File.generated(config, f"{RESULTS_URI}/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = Path(config["config_file_path"]).resolve().parent
    if page.file.src_uri.startswith(f"{RESULTS_URI}/"):
        markdown = site_links(markdown, RESULTS_DIR, Path(config["docs_dir"]).resolve().relative_to(root).as_posix(),
                              RESULTS_URI)
    return MARKER.sub(lambda match: generate(match.group(1), root), markdown)


LINK = re.compile(r"(\]\()([^)\s]+)(\))")  # a Markdown link's target: ](target)


def site_links(markdown: str, folder: str, docs: str, site_folder: str) -> str:
    """``markdown`` of a file in the repository's ``folder`` shown on the site as ``site_folder``: each
    relative link into the repository's ``docs`` folder points at that page of the site instead (both
    folders relative to the repository root); other links are left as they are."""
    import posixpath

    def mapped(match: re.Match) -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("#", "/", "mailto:")):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        in_repo = posixpath.normpath(posixpath.join(folder, path))
        if not in_repo.startswith(docs.rstrip("/") + "/"):
            return match.group(0)
        page = in_repo[len(docs.rstrip("/")) + 1:]
        return match.group(1) + posixpath.relpath(page, site_folder) + hash_ + anchor + match.group(3)

    return LINK.sub(mapped, markdown)


def generate(what: str, root: Path) -> str:
    """The Markdown for one marker."""
    if what == "commands":
        return commands_markdown()
    if what == "configuration":
        return configuration_markdown(root)
    if what == "shipped-configs":
        return shipped_configs_markdown(root)
    if what == "results-index":
        return results_index_markdown(root)
    raise ValueError(f"unknown generated block {what!r}")


def results_index_markdown(root: Path) -> str:
    """A list of every results file, newest first, with its first heading as the title."""
    paths = [p for p in (root / RESULTS_DIR).iterdir() if p.is_file() and not p.name.startswith(".")]
    paths.sort(key=lambda p: (not p.name[:1].isdigit(), [-ord(c) for c in p.name]))
    lines = []
    for path in paths:
        title = ""
        if path.suffix == ".md":
            title = next((line[2:].strip() for line in path.read_text(encoding="utf-8").splitlines()
                          if line.startswith("# ")), "")
        lines.append(f"- [`{path.name}`]({RESULTS_URI}/{path.name})" + (f": {title}" if title else ""))
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- commands


CODE_WIDTH = 72  # usage and example blocks are wrapped to fit the page's text column at 1280 pixels
_BREAK_AFTER = re.compile(r"([._,/])(?=[^\s])")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _escape(text: Any) -> str:
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def breakable_code(text: Any) -> str:
    """``text`` as inline code for a table cell that a browser may break only after a dot, underscore,
    comma or slash (``<wbr>``; the site's CSS forbids breaks inside words): ``prune.compress_configs``."""
    return "<code>" + _BREAK_AFTER.sub(r"\1<wbr>", _escape(text)).replace("|", "&#124;") + "</code>"


def _prose(text: Any) -> str:
    """Help or comment text for a table cell: ``<`` and ``>`` shown as such, not read as HTML."""
    return _cell(str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


def _parser() -> argparse.ArgumentParser:
    saved = sys.argv[:]
    sys.argv[:] = ["__main__.py"]  # the parser names its program after argv[0]
    try:
        return module("cli").build_parser()
    finally:
        sys.argv[:] = saved


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order the parser lists them."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=CODE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return formatter.format_help().strip()


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    formatter = argparse.HelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.dest in COMMON_DESTS:
            continue
        name = formatter._format_action_invocation(action)
        meaning = formatter._expand_help(action) if action.help else ""
        if re.fullmatch(r"\(default: [^)]*\)", meaning):
            meaning = ""  # the default column says it
        default = action.default
        if action.required or default is None or default is False or default is argparse.SUPPRESS \
                or action.nargs == 0:
            shown = "required" if action.required else ""
        else:
            shown = f"`{default}`"
        rows.append(f"| {breakable_code(name)} | {shown} | {_prose(meaning)} |")
    return rows


def _example(parser: argparse.ArgumentParser) -> str:
    epilog = parser.epilog or ""
    match = re.search(r"example:\n(.*?)(?:\n\n|$)", epilog, re.S)
    return match.group(1).strip() if match else ""


def wrapped_command(line: str, width: int = CODE_WIDTH) -> str:
    """A shell command line as a code block shows it within ``width`` columns: a trailing ``# comment``
    on its own line above, the command broken at spaces with ``\\`` continuations (still runnable)."""
    command, _, comment = line.partition("  #")
    out = [f"#{comment.rstrip()}"] if comment.strip() else []
    words, current = command.split(), ""
    for word in words:
        if current and len(current) + 1 + len(word) > width - 2:
            out.append(current + " \\")
            current = "    " + word
        else:
            current = f"{current} {word}" if current else word
    return "\n".join(out + [current])


def commands_markdown() -> str:
    parser = _parser()
    lines = [f"Every command is `{parser.prog} COMMAND` (or the `tpugraphs` console script).", "",
             "| command | what it does |", "|---|---|"]
    subcommands = _subcommands(parser)
    for name, help_text, _ in subcommands:
        lines.append(f"| [`{name}`](#{name}) | {_prose(help_text)} |")
    epilog = "\n".join(textwrap.fill(line, CODE_WIDTH, subsequent_indent="  ") if line.strip() else line
                       for line in (parser.epilog or "").strip().splitlines())
    lines += ["", "Options every command takes: `-v/--verbose` (debug messages too) and `-q/--quiet` (warnings, "
              "errors and the result only).", "", "```text", epilog, "```", ""]
    for name, _, sub in subcommands:
        lines += _command_section(name, sub, level=2)
    return "\n".join(lines) + "\n"


def _command_section(name: str, sub: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{name}` {{#{name.replace(' ', '-')}}}", "", _prose(sub.description or ""), "",
             "```text", _usage(sub), "```", ""]
    lines += _options_table(sub) + [""]
    example = _example(sub)
    if example:
        lines += ["Example:", "", "```bash", *(wrapped_command(line) for line in example.splitlines()), "```", ""]
    for child, help_text, child_parser in _subcommands(sub):
        child_parser.description = child_parser.description or (help_text[:1].upper() + help_text[1:] + ".")
        lines += _command_section(f"{name} {child}", child_parser, level + 1)
    return lines


# ----------------------------------------------------------------------------- configuration


@dataclasses.dataclass
class FieldDoc:
    name: str
    group: str  # the "# --- group" heading the field sits under, or ""
    comment: str  # the comment above the field and beside it, joined


def field_comments(cls: type) -> dict[str, FieldDoc]:
    """The comment of each field of dataclass ``cls``, read from its source file with ``tokenize``/``ast``.

    A field's comment is the run of comment-only lines right above it (up to a blank line or code) plus
    the comment on its own line(s); a ``# --- name`` line starts a group.
    """
    path = Path(sys.modules[cls.__module__].__file__)
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    comments: dict[int, str] = {}  # line -> comment text
    alone: set[int] = set()  # lines that hold only a comment
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            comments[row] = token.string.lstrip("#").strip()
            if not lines[row - 1][:col].strip():
                alone.add(row)
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    out: dict[str, FieldDoc] = {}
    group = ""
    for item in node.body:
        if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
            continue
        above: list[str] = []
        row = item.lineno - 1
        while row in alone:
            above.append(comments[row])
            row -= 1
        above.reverse()
        for index, text in enumerate(above):
            if text.startswith("---"):
                group = text.strip("- ").strip()
                above = above[index + 1:]
                break
        beside = [comments[r] for r in range(item.lineno, item.end_lineno + 1) if r in comments and r not in alone]
        out[item.target.id] = FieldDoc(item.target.id, group, " ".join(above + beside).strip())
    return out


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("pathlib.", "")


def toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Path):
        return toml_literal(str(value))
    return repr(value)


def allowed(meta: typing.Mapping[str, Any]) -> str:
    """The allowed values that ``metadata`` states (see the field helpers: choices, min/max/below, items)."""
    parts = []
    if "choices" in meta:
        choices = meta["choices"]  # a tuple, or a function that returns one (choices read from a registry)
        parts.append(" \\| ".join(f"`{toml_literal(c)}`" for c in (choices() if callable(choices) else choices)))
    low, high, below = meta.get("min"), meta.get("max"), meta.get("below")
    if low is not None and (high is not None or below is not None):
        parts.append(f"{low} to {high}" if high is not None else f"{low} to below {below}")
    elif low is not None:
        parts.append(f">= {low}")
    elif high is not None:
        parts.append(f"<= {high}")
    elif below is not None:
        parts.append(f"< {below}")
    if "min_items" in meta:
        parts.append(f"at least {meta['min_items']} item(s)")
    if meta.get("unique"):
        parts.append("distinct")
    return "; ".join(parts)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def sections() -> list[tuple[str, type]]:
    """(TOML section name, dataclass) of every section of the pipeline config, in order."""
    pipeline = getattr(module("settings"), PIPELINE_CLASS)
    hints = typing.get_type_hints(pipeline)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(pipeline)]


def config_settings() -> list[tuple[str, str, dataclasses.Field, FieldDoc]]:
    """(section, key, field, its comment) of every setting of the pipeline config (per-collection tables excluded)."""
    out = []
    for section, cls in sections():
        docs = field_comments(cls)
        for f in dataclasses.fields(cls):
            if f.name != PER_COLLECTION and f.init:
                out.append((section, f.name, f, docs.get(f.name, FieldDoc(f.name, "", ""))))
    return out


def toml_comments(path: Path) -> dict[str, list[str]]:
    """``"section.key"`` (or ``"[table]"`` for a table header) -> the comment lines above and beside it."""
    out: dict[str, list[str]] = {}
    table, pending, last = "", [], None  # last: the key an indented comment line continues
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line:
            pending, last = [], None
        elif line.startswith("#"):
            if last is not None and raw[:1].isspace():
                out[last].append(line.lstrip("#").strip())
            else:
                pending.append(line.lstrip("#").strip())
                last = None
        elif line.startswith("["):
            table = line.strip("[]").strip()
            out[f"[{table}]"] = pending
            pending, last = [], None
        elif "=" in line:
            key = line.split("=", 1)[0].strip()
            value = line.split("=", 1)[1]
            beside = value.split("#", 1)[1].strip() if "#" in value else ""
            last = f"{table}.{key}"
            out[last] = pending + ([beside] if beside else [])
            pending = []
    return out


def _why(lines: list[str]) -> str:
    """The ``why:`` line of a TOML comment (the one-line reason for a default), without the prefix."""
    for line in lines:
        if line.lower().startswith("why:"):
            return line[4:].strip()
    return ""


def section_summary(cls: type) -> str:
    """The first line of the section's docstring, or of its module's (a dataclass without one gets a signature)."""
    doc = cls.__doc__ or ""
    if not doc.strip() or doc.startswith(cls.__name__ + "("):
        doc = sys.modules[cls.__module__].__doc__ or ""
    first = doc.strip().splitlines()[0] if doc.strip() else ""
    return re.sub(r"\s*\(.*\)\.?$", ".", first)


def configuration_markdown(root: Path) -> str:
    base = root / CONFIGS_DIR / "base.toml"
    notes = toml_comments(base)
    base_values = tomllib.loads(base.read_text(encoding="utf-8"))
    lines: list[str] = []
    current = None
    for section, key, f, doc in config_settings():
        cls = dict(sections())[section]
        if section != current:
            current = section
            summary = section_summary(cls)
            lines += ["", f"## `[{section}]`", "", summary, "",
                      "| setting (type) | default | allowed | meaning, and why this default |", "|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        default = _default(f)
        shown = "required" if default is dataclasses.MISSING else f"`{_cell(toml_literal(default))}`"
        in_base = base_values.get(section, {}).get(key, default)
        if default is not dataclasses.MISSING and in_base != default:
            shown += f" (base.toml: `{_cell(toml_literal(in_base))}`)"
        meaning = (f"*{doc.group}.* " if doc.group else "") + doc.comment
        why = _why(notes.get(f"{section}.{key}", []))
        explained = _prose(meaning) + (f"<br>*Why this default:* {_prose(why)}" if why else "")
        lines.append(f"| <span id=\"{section}.{key}\">{breakable_code(f'{section}.{key}')}</span><br>"
                     f"{breakable_code(_type_name(hints[key]))} | {shown} | {allowed(f.metadata)} | {explained} |")
    lines += ["", "## Per-collection overrides in `base.toml`", "",
              f"A section's `{PER_COLLECTION}` table overrides some of its settings for one collection. "
              "These are base's; a later file or `--set` that sets the section's key replaces them.", "",
              "| collection | setting | value (section default) | why |", "|---|---|---|---|"]
    for section, cls in sections():
        per = base_values.get(section, {}).get(PER_COLLECTION, {})
        defaults = {f.name: _default(f) for f in dataclasses.fields(cls)}
        for collection, table in per.items():
            header = notes.get(f'[{section}.{PER_COLLECTION}."{collection}"]', [])
            for key, value in table.items():
                key_notes = notes.get(f'{section}.{PER_COLLECTION}."{collection}".{key}', [])
                why = _why(key_notes) or _why(header)
                default = toml_literal(base_values[section].get(key, defaults.get(key)))
                lines.append(f"| {breakable_code(collection)} | <a href=\"#{section}.{key}\">"
                             f"{breakable_code(f'{section}.{key}')}</a> | {breakable_code(toml_literal(value))} "
                             f"({breakable_code(default)}) | {_prose(why)} |")
    lines += ["", "## Shipped configs", "", shipped_configs_markdown(root)]
    return "\n".join(lines) + "\n"


def _flatten(table: Any, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value and key != "extends":
            out.update(_flatten(value, name))
        else:
            out[name] = value
    return out


def first_sentence(toml_text: str) -> str:
    """The first sentence of a TOML file's opening comment (its lines joined; a "." ends a sentence
    where a space or the end follows)."""
    block = []
    for line in toml_text.splitlines():
        if not line.startswith("#"):
            if block:
                break
            continue
        block.append(line.lstrip("#").strip())
    text = " ".join(block)
    match = re.search(r"\.(\s|$)", text)
    return text[:match.start() + 1] if match else text


def shipped_configs_markdown(root: Path) -> str:
    """One row per shipped config: what it extends, its first comment line, and what it sets."""
    lines = ["| config | extends | purpose | sets |", "|---|---|---|---|"]
    for path in sorted((root / CONFIGS_DIR).glob("*.toml")):
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
        first = first_sentence(text)
        if path.stem == "base":
            sets = "every setting (the defaults)"
        else:
            sets = ", ".join(breakable_code(f"{k} = {toml_literal(v)}") for k, v in _flatten(data).items()
                             if k != "extends")
        lines.append(f"| `{path.stem}` | {data.get('extends', '')} | {_prose(first)} | {sets} |")
    return "\n".join(lines) + "\n"
