"""Item pipelines of scrapy_fleet; both acknowledge-safe (see docs/architecture.md)."""

from scrapy_fleet.pipelines.jsonlines import JsonLinesPipeline
from scrapy_fleet.pipelines.mongo import MongoPipeline

__all__ = ["JsonLinesPipeline", "MongoPipeline"]
