"""``python -m testsite generate|serve`` — see :mod:`testsite`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testsite.generate import generate_site, positive_int


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testsite")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="write a deterministic static site into DIR")
    gen.add_argument("dir", type=Path)
    gen.add_argument("--pages", type=positive_int, default=200,
                     help="number of pages (default 200)")
    gen.add_argument("--links", type=positive_int, default=8, help="links per page (default 8)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--prefix", default="site", help="first path segment (default site)")

    srv = sub.add_parser("serve", help="serve DIR until SIGTERM/SIGINT; prints the base URLs")
    srv.add_argument("dir", type=Path)
    srv.add_argument(
        "--bind", action="append", help="address to listen on; repeatable (default 127.0.0.1)"
    )
    srv.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one")
    srv.add_argument("--log", type=Path, help="append one JSON line per request to this file")
    srv.add_argument("--config", type=Path, help="JSON behaviour file (delays, failures, robots)")

    args = parser.parse_args(argv)
    if args.command == "generate":
        paths = generate_site(args.dir, args.pages, args.links, seed=args.seed, prefix=args.prefix)
        print(f"wrote {len(paths)} pages under {args.dir / args.prefix}; start at /{args.prefix}/")
        return 0

    from twisted.internet import reactor

    from testsite.server import Behaviour, SiteServer

    if not args.dir.is_dir():
        parser.error(f"not a directory: {args.dir}")
    behaviour = Behaviour.from_dict(json.loads(args.config.read_text())) if args.config else None
    site = SiteServer(args.dir, args.bind, args.port, args.log, behaviour)
    for url in site.start():
        print(url)
    sys.stdout.flush()
    reactor.run()  # type: ignore[attr-defined,misc]  # installs SIGTERM/SIGINT handlers that stop it
    site.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
