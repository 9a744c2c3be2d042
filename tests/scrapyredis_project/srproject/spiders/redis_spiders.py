"""Spiders shaped like scrapy-redis's example project (its ``myspider_redis`` and
``mycrawler_redis``), written for these tests: start data from a Redis key, one item
(``name``, ``url``) per HTML page.  ``fleet_*`` are the same spiders on scrapy_fleet's own
``RedisSpider``/``RedisCrawlSpider`` (a project that dropped the scrapy-redis dependency)."""

from __future__ import annotations

from typing import Any

from scrapy.http import HtmlResponse
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider, RedisSpider

from scrapy_fleet.compat import spiders as fleet_spiders


def page_item(response: Any) -> Any:
    if isinstance(response, HtmlResponse):
        yield {"name": response.css("title::text").get(), "url": response.url}


class _Domains:
    def __init__(self, *args: Any, domain: str = "", **kwargs: Any) -> None:
        self.allowed_domains = [d for d in domain.split(",") if d]
        super().__init__(*args, **kwargs)


class OnePageSpider(_Domains, RedisSpider):
    name = "myspider_redis"
    redis_key = "myspider:start_urls"

    def parse(self, response: Any) -> Any:
        return page_item(response)


class FollowingSpider(_Domains, RedisCrawlSpider):
    name = "mycrawler_redis"
    redis_key = "mycrawler:start_urls"
    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

    def parse_page(self, response: Any) -> Any:
        return page_item(response)


class FleetOnePageSpider(_Domains, fleet_spiders.RedisSpider):
    name = "fleet_myspider_redis"
    redis_key = "fleetspider:start_urls"

    def parse(self, response: Any) -> Any:
        return page_item(response)


class FleetFollowingSpider(_Domains, fleet_spiders.RedisCrawlSpider):
    name = "fleet_mycrawler_redis"
    redis_key = "fleetcrawler:start_urls"
    rules = (Rule(LinkExtractor(), callback="parse_page", follow=True),)

    def parse_page(self, response: Any) -> Any:
        return page_item(response)
