"""Fetch and parse stages (``FLEET_ROLE``) joined by stored responses in the frontier.

| module | what |
| --- | --- |
| ``records`` | the stored response record (format version 2 of a frontier payload) |
| ``roles`` | what a fetch or parse worker does differently (one hook on the downloader) |

See docs/stages.md.
"""
