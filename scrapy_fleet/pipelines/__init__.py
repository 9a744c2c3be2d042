"""Item pipelines of scrapy_fleet; both acknowledge-safe (see docs/architecture.md)."""

from scrapy_fleet.pipelines.jsonlines import JsonLinesPipeline
from scrapy_fleet.pipelines.mongo import MongoPipeline
from scrapy_fleet.pipelines.mongo_writes import DocumentRejected

__all__ = ["DocumentRejected", "JsonLinesPipeline", "MongoPipeline"]
