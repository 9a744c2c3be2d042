"""Encoded size of typical requests: ``scrapy_fleet.codec`` vs pickle of ``Request.to_dict``.

The baseline is what a pickle-based Redis scheduler stores:
``pickle.dumps(request.to_dict(spider=spider), protocol=pickle.HIGHEST_PROTOCOL)``.
For each request shape the bench reports both sizes and their ratio, and (informational)
the encode+decode time per request of both (median of ``--repeat`` timing rounds), where
"decode" rebuilds the Request (``codec.decode`` / ``request_from_dict(pickle.loads(...))``).

Usage: ``.venv/bin/python bench/bench_codec.py [--repeat 5] [--number 2000]``
"""

from __future__ import annotations

import argparse
import pickle
import sys
import timeit
from typing import Any

import _harness as h
from example_project.spiders.docs import DocsSpider
from scrapy import FormRequest, Request
from scrapy.utils.request import request_from_dict

from scrapy_fleet import codec
from scrapy_fleet.catalog import DEFAULT_REQUEST_CLASSES

BASE = "https://docs.python.org/3/"


def shapes(spider: DocsSpider) -> dict[str, Request]:
    """Requests as they reach the scheduler (RefererMiddleware and DepthMiddleware have run)."""
    return {
        "start URL (pushed)": Request(BASE),
        "followed link": Request(
            BASE + "library/asyncio-task.html", callback=spider.parse,
            headers={"Referer": BASE + "library/asyncio.html"},
            meta={"depth": 3, "scope": BASE}, priority=-3),
        "link + cookies, cb_kwargs, errback": Request(
            BASE + "library/os.html?highlight=path#os.path", callback=spider.parse,
            errback=spider.parse, cookies={"session": "d41d8cd98f00b204e9800998ecf8427e"},
            headers={"Referer": BASE + "library/index.html", "Accept-Language": "en"},
            meta={"depth": 2, "scope": BASE, "download_timeout": 20},
            cb_kwargs={"section": "os", "page": 2}, priority=5),
        "form POST": FormRequest(
            BASE + "search.html", callback=spider.parse,
            formdata={"q": "asyncio task group", "check_keywords": "yes", "area": "default"},
            headers={"Referer": BASE}, meta={"depth": 1, "scope": BASE}),
    }


def pickle_encode(request: Request, spider: DocsSpider) -> bytes:
    return pickle.dumps(request.to_dict(spider=spider), protocol=pickle.HIGHEST_PROTOCOL)


def pickle_decode(data: bytes, spider: DocsSpider) -> Request:
    return request_from_dict(pickle.loads(data), spider=spider)


def per_call_us(fn: Any, number: int, repeat: int) -> float:
    return 1e6 * h.median(timeit.repeat(fn, number=number, repeat=repeat)) / number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args(argv)
    spider = DocsSpider()
    classes = DEFAULT_REQUEST_CLASSES
    rows = []
    for name, req in shapes(spider).items():
        fleet = codec.encode(req, spider)
        pick = pickle_encode(req, spider)
        back = codec.decode(fleet, spider, classes)
        assert back.to_dict(spider=spider) == req.to_dict(spider=spider), name
        fleet_us = per_call_us(lambda r=req: codec.decode(codec.encode(r, spider), spider,
                                                           classes), args.number, args.repeat)
        pickle_us = per_call_us(lambda r=req: pickle_decode(pickle_encode(r, spider), spider),
                                args.number, args.repeat)
        rows.append({"shape": name, "fleet_bytes": len(fleet), "pickle_bytes": len(pick),
                     "ratio": round(len(fleet) / len(pick), 3),
                     "fleet_us": round(fleet_us, 1), "pickle_us": round(pickle_us, 1)})

    print("Request encoding: scrapy_fleet.codec (msgpack, defaults left out) vs "
          "pickle.dumps(request.to_dict(spider=spider), HIGHEST_PROTOCOL)")
    print(f"  {'shape':38} {'codec B':>8} {'pickle B':>9} {'ratio':>6}   "
          f"{'codec us':>9} {'pickle us':>9}  (encode+decode, informational)")
    for r in rows:
        print(f"  {r['shape']:38} {r['fleet_bytes']:8d} {r['pickle_bytes']:9d} "
              f"{r['ratio']:6.2f}   {r['fleet_us']:9.1f} {r['pickle_us']:9.1f}")
    fig = {"bench": "codec", **h.machine(), "shapes": rows,
           "median_size_ratio": round(h.median([r["ratio"] for r in rows]), 3)}
    print(f"  median size ratio codec/pickle: {fig['median_size_ratio']:.2f}")
    print()
    h.emit_json(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
