"""``--set`` overrides stay linear in their length and hostile values are usage errors (issue 78, item 6).

The quadratic part was the command line's error path: every message is passed through
``redact_credentials``, whose pattern rescanned a long run of characters from each of its positions."""

from __future__ import annotations

import time

import pytest

from pipelines.cli import main
from pipelines.config.settings import load_config
from pipelines.core.errors import ConfigError, redact_credentials


@pytest.mark.parametrize("text, shown", [
    ("tcp://alice:hunter2@127.0.0.1:8786", "tcp://alice:***@127.0.0.1:8786"),
    ("error: alice:hunter2@host and bob:pa:ss@other", "error: alice:***@host and bob:***@other"),
    ("'user:secret@host'", "'user:***@host'"),
    ("no credentials: a@b, c:d, :@x, user:@host", "no credentials: a@b, c:d, :@x, user:@host"),
    ("https://u:p@h/a:b@c", "https://u:***@h/a:***@c"),
])
def test_redaction_hides_the_secret_and_nothing_else(text, shown):
    assert redact_credentials(text) == shown


def test_redaction_is_linear_in_the_length_of_the_text():
    for text in ("a" * 200_000, "a:" * 100_000, ("x" * 999 + " ") * 200):
        started = time.perf_counter()
        assert redact_credentials(text) == text
        assert time.perf_counter() - started < 1.0, len(text)


@pytest.mark.parametrize("override", [
    "run." + "a" * 100_000 + "=1",
    "a" * 100_000 + ".x=1",
    "run.n_jobs=" + "x" * 100_000 + " y",  # the message quotes the value
])
def test_a_100_kb_override_is_refused_in_seconds(override, capsys):
    started = time.perf_counter()
    assert main(["config", "--set", override]) == 2
    assert time.perf_counter() - started < 5.0
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("value, problem", [
    ("[" * 5000 + "]" * 5000, "nested"),
    ("{a=" * 3000 + "1" + "}" * 3000, "nested"),
    ("1" * 5000, "digits"),
])
def test_hostile_values_are_config_errors(value, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config("smoke", [f"run.seeds={value}"])


def test_a_config_file_nested_too_deep_is_a_config_error(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("[run]\nseeds = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nested"):
        load_config(path)
