"""The shared frontier: the Redis client of frontier.lua, the Scrapy scheduler over it, the
fleet-wide Bloom dupefilter, the spider middleware for start requests, memory checks.

| module | what |
| --- | --- |
| ``call`` | ``FrontierCall``: one call of ``lua/frontier.lua`` described without IO (its steps) |
| ``port`` | ``WorkerFrontier``: the one interface of a worker's frontier client (pump, scheduler) |
| ``client`` | ``AsyncFrontier``: the workers' client, the asyncio transport of ``FrontierCall`` |
| ``admin`` | ``FrontierAdmin``: the commands' blocking client (its transport; push, purge...) |
| ``protocol`` | a call's arguments (``CallBatch``, ``FrontierParams``) and reply (``CallResult``) |
| ``dupecache`` | ``DupeCache``: Bloom keys a worker knows to be duplicates |
| ``replies`` | ``ReplyFiler``: a call's reply filed into the lease book (stats, lost, new leases) |
| ``partview`` | a partitioned worker's view of the crawl: idleness, the response queue |
| ``scheduler`` | ``FleetScheduler``: Scrapy's scheduler interface over the frontier |
| ``dupefilter`` | ``RedisBloomDupeFilter``: the dupefilter interface over the same Bloom filter |
| ``bloom`` | scalable Bloom filter parameters (the filter runs in ``lua/bloom.lua``) |
| ``spidermw`` | ``FleetSpiderMiddleware``: start requests, their back pressure, link parents |
| ``memory`` | Redis ``maxmemory`` checks at start |
"""
