"""The JSON-lines sink's settings (``FLEET_JSONL_PATH``, ``FLEET_JSONL_FSYNC``;
pipelines/jsonlines.py), read once into one validated :class:`JsonlConfig`; the catalog rows
are in catalog.py, and ``FleetConfig.jsonl`` holds the worker's, so that every command
refuses a bad path as a worker does.  (It lives outside ``pipelines/``: that package's
``__init__`` imports the pipelines, which import config.py, and MongoDB's client.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_fleet.checks import boolean, check, setting_value
from scrapy_fleet.errors import FleetConfigError

#: the placeholders FLEET_JSONL_PATH may hold, with sample values for its check
PLACEHOLDERS = {"worker": "w", "pid": 1, "spider": "s", "crawl_id": "c"}


@dataclass(frozen=True)
class JsonlConfig:
    """Validated JSON-lines settings: ``path``, the file with its ``%(worker)s``,
    ``%(pid)s``, ``%(spider)s`` and ``%(crawl_id)s`` placeholders, or None (the pipeline
    is off); ``fsync``: each line is also fsync-ed."""

    path: str | None = None
    fsync: bool = False


def jsonl_config(settings: BaseSettings | Mapping[str, Any]) -> JsonlConfig:
    """Read and validate the JSON-lines settings (the path's placeholders, not its folder:
    pipelines/jsonlines.py's ``prepare_path`` checks that at start).

    Raises:
        FleetConfigError: naming the setting and the value.
    """
    path = setting_value(settings, "FLEET_JSONL_PATH")
    check("FLEET_JSONL_PATH", path, path is None or (isinstance(path, str) and path != ""),
           "a file path or None")
    if path is not None:
        try:
            path % PLACEHOLDERS
        except (KeyError, ValueError, TypeError) as exc:
            raise FleetConfigError(
                f"FLEET_JSONL_PATH={path!r} is invalid: placeholders may be %(worker)s, "
                f"%(pid)s, %(spider)s, %(crawl_id)s; write %% for a % ({exc!r})") from None
    return JsonlConfig(path=path,
                       fsync=boolean("FLEET_JSONL_FSYNC",
                                     setting_value(settings, "FLEET_JSONL_FSYNC")))
