"""Watching a running study: its events and their words, the live display, the notification.

`events` (what a running study emits and how it is said), `state` (the events folded into what
the display shows; pure), `live` (a rich panel on a terminal, plain lines elsewhere), `notify`
(the command run with a JSON summary when the night ends).
"""
