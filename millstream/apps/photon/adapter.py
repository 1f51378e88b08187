"""The demo's adapter: an ad click joined with its search query into a billing event."""

from __future__ import annotations

from millstream.photon.adapter import Event, JoinAdapter


class AdClickAdapter(JoinAdapter):
    """Projects the fields a billing report needs and enriches them with the cost in dollars.

    >>> AdClickAdapter().join({"text": "red shoes", "server": "web-1", "ads": 3},
    ...                       {"query_id": "web-1:4001:1000:0", "ad": "ad-7", "slot": 0, "cost_micros": 250_000})
    {'query': 'red shoes', 'server': 'web-1', 'ad': 'ad-7', 'slot': 0, 'cost_micros': 250000, 'cost_usd': 0.25}
    """

    def project(self, query: Event, click: Event) -> Event:
        return {"query": query["text"], "server": query["server"], "ad": click["ad"], "slot": click["slot"],
                "cost_micros": click["cost_micros"]}

    def enrich(self, joined: Event) -> Event:
        return {**joined, "cost_usd": joined["cost_micros"] / 1_000_000}
