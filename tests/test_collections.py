import pytest

from pipelines.core.collection import (
    ALL_COLLECTIONS, LAYOUT_NLP_RANDOM, TILE_XLA, parse_collection, parse_collections, split_submission_id,
)
from pipelines.core.errors import ConfigError


def test_names_directories_and_ids():
    assert [c.name for c in ALL_COLLECTIONS] == [
        "tile:xla", "layout:xla:default", "layout:xla:random", "layout:nlp:default", "layout:nlp:random"]
    assert str(LAYOUT_NLP_RANDOM.relative_dir) == "layout/nlp/random"
    assert str(TILE_XLA.relative_dir) == "tile/xla"
    assert LAYOUT_NLP_RANDOM.submission_id("abc") == "layout:nlp:random:abc"


def test_parse_known_and_unknown():
    assert parse_collection("layout:nlp:random") is LAYOUT_NLP_RANDOM
    assert parse_collections("tile:xla,layout:nlp:random,tile:xla") == (TILE_XLA, LAYOUT_NLP_RANDOM)
    assert parse_collections(None) == ALL_COLLECTIONS == parse_collections("all")
    with pytest.raises(ConfigError, match="unknown collection 'layout:tpu'.*tile:xla"):
        parse_collection("layout:tpu")


def test_split_submission_id():
    assert split_submission_id("tile:xla:alexnet_-1bae") == (TILE_XLA, "alexnet_-1bae")
    assert split_submission_id("layout:nlp:random:0a1b") == (LAYOUT_NLP_RANDOM, "0a1b")
    for bad in ("layout:nlp:0a1b", "tile:xla:", "foo:bar:baz", "tile:xla:a:b"):
        with pytest.raises(ValueError):
            split_submission_id(bad)
