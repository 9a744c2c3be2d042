"""Browser pages through the fleet (scrapy-playwright).

| module | what |
| --- | --- |
| ``pagemethods`` | how ``PageMethod`` objects travel in the frontier (codec extension), and the
  JSON form pushed lines use |
| ``handler`` | what ``FLEET_PLAYWRIGHT = True`` makes the add-on set: scrapy-playwright's
  download handlers, the asyncio reactor, and an abort rule for heavy resources |

See docs/browser.md.
"""
