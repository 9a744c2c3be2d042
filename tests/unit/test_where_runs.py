"""The filter of ``url``'s second pass (frontier/where.py ``url_runs``, ``has_runs``): an entry
it rejects never has the looked-up URL's fingerprint (checked over generated spellings against
Scrapy's own fingerprint), and it rejects the entries of other URLs."""

from __future__ import annotations

import random
import string

import pytest
from scrapy import Request
from scrapy.utils.request import fingerprint
from w3lib.url import canonicalize_url

from scrapy_fleet.frontier.where import _UNSURE as UNSURE
from scrapy_fleet.frontier.where import has_runs, url_runs

#: pieces of paths and queries that canonicalization changes: dot segments, fragments, query
#: order and separators, blanks, case, non-ASCII, characters it percent-encodes
PIECES = ["a", "B", "~", "\u00e9", "+", " ", "..", ".", "x.y", "-", "_", "=", "&", ";", "?",
          "#", "/", "//", "100", "\u00fc", "Z9", "./", "../", "&&", "==", "?&", "a=", "=b", ":",
          "@", "!", "$", "'", "(", ")", "*", ",", "\u212a", "\uff21", "1.0", "%41", "%2F",
          "%7e", "%3", "%30", "%zz", "%C3%A9"]
BASES = ["http://Ex.Org/", "https://ex.org:8080/", "http://u:p@ex.org/", "http://[::0:1]/",
         "http://b\u00fccher.example/", "http://ex.org/p?"]


def spellings(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alpha = string.printable[:-5] + "\u00e9\u00fc\u00df\u212a\u0130\u00b2"
    out = []
    for i in range(n):
        if i % 2:
            tail = "".join(rng.choice(alpha) for _ in range(rng.randrange(1, 20)))
        else:
            tail = "".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 10)))
        out.append(rng.choice(BASES) + tail)
    return out


def runs_of(url: str) -> frozenset[bytes]:
    """The runs ``url`` looks for when *url* is looked up (where.py ``probe_for``)."""
    return url_runs(canonicalize_url(Request(url).url))


def test_an_entry_the_filter_rejects_never_has_the_urls_fingerprint():
    """For each generated entry URL E and a second spelling S of it (E canonicalized, E as
    ``Request.url``, E with its query reordered or a fragment): S's runs never reject E, so
    the second pass fingerprints every entry that can match.  Entries with an escape of a
    letter, a digit or '%', or a '%' without two hex digits, are never rejected
    (canonicalization can make a run of two escapes: /100%3%30 -> /100%30)."""
    checked = rejected_pct = rejected_escaped = 0
    for entry in spellings(3000, seed=3):
        try:
            stored = Request(entry).url  # what the frontier keeps
        except ValueError:
            continue
        for other in (entry, stored, canonicalize_url(stored), stored + "#frag"):
            if fingerprint(Request(other)) != fingerprint(Request(stored)):
                continue
            checked += 1
            assert has_runs(stored, runs_of(other)), (stored, other)
        if UNSURE.search(stored):
            rejected_pct += not has_runs(stored, frozenset({b"\x00never"}))
        elif "%" in stored:  # (only escapes of what is not a letter or a digit: decoded)
            rejected_escaped += not has_runs(stored, frozenset({b"\x00never"}))
    assert checked > 6000 and rejected_pct == 0 and rejected_escaped > 100


@pytest.mark.parametrize(("entry", "looked_up"), [
    ("http://a.test/x?b=2&a=1", "http://a.test/x?a=1&b=2"),
    ("http://a.test/dir/./sub/../page?y=2&x=1#top", "http://a.test/dir/page?x=1&y=2"),
    ("http://a.test/Caf\u00e9/Page?Q=A+b", "http://A.TEST/Caf%C3%A9/Page?Q=A%20b"),
    ("http://a.test/%41bc", "http://a.test/Abc"),
    ("http://a.test/Abc", "http://a.test/%41bc"),
    ("http://a.test/", "http://a.test/#x"),
])
def test_two_spellings_of_one_canonical_url_pass(entry, looked_up):
    assert fingerprint(Request(entry)) == fingerprint(Request(looked_up))
    assert has_runs(Request(entry).url, runs_of(looked_up))


@pytest.mark.parametrize(("entry", "looked_up"), [
    ("http://a.test/item/17?ref=nav", "http://a.test/item/7?ref=nav"),
    ("http://a.test/item/7?ref=nav", "http://a.test/item/7?ref=footer"),
    ("http://a.test/item/7", "http://a.test/item/7/8"),
    ("http://a.test/caf%C3%A9/7%20x", "http://a.test/caf%C3%A9/8%20x"),  # decoded escapes
])
def test_the_entries_of_other_urls_are_rejected(entry, looked_up):
    assert fingerprint(Request(entry)) != fingerprint(Request(looked_up))
    assert not has_runs(Request(entry).url, runs_of(looked_up))
