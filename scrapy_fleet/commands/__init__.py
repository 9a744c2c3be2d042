"""Scrapy commands of scrapy_fleet (registered through the ``scrapy.commands`` entry point)."""
