"""The adapter: what a Photon join knows about the user's events (the paper's "adapter library").

Photon's joiner hands every (query, click) pair it found to an adapter that filters, projects and
enriches it into the joined event; keeping that logic out of the joiner is what lets one joiner serve
many joins. Here the adapter also says how to read the two logs: which field of a click is its id and
which names its query, and which field of a primary record is its id.

Subclass `JoinAdapter` and override what differs; every method must be a pure function of its
arguments (the dispatcher may call it again for the same click after a failure).
"""

from __future__ import annotations

from typing import Any

from millstream.model.records import Record

Event = dict[str, Any]


class JoinAdapter:
    """The default adapter: click records keyed by their click id with `value["query_id"]`, primary
    records keyed by their query id, every pair kept, joined as `{"query": ..., "click": ...}`.

    >>> class AdCost(JoinAdapter):
    ...     def filter(self, query, click):
    ...         return not click.get("spam", False)
    ...     def project(self, query, click):
    ...         return {"text": query["text"], "ad": click["ad"]}
    ...     def enrich(self, joined):
    ...         return {**joined, "cost_micros": 10_000 * len(joined["text"])}
    >>> adapter = AdCost()
    >>> adapter.join({"text": "shoes"}, {"ad": "a-1", "query_id": "q"})
    {'text': 'shoes', 'ad': 'a-1', 'cost_micros': 50000}
    >>> adapter.join({"text": "shoes"}, {"ad": "a-1", "spam": True}) is None
    True
    >>> adapter.click_id(Record("c-17", {"query_id": "web:1:1000:0"}, 1_500)), adapter.query_id_of_click(
    ...     Record("c-17", {"query_id": "web:1:1000:0"}, 1_500))
    ('c-17', 'web:1:1000:0')
    """

    def click_id(self, click: Record[Any]) -> str:
        """The click's unique id: what the IdRegistry registers (default: the record's key)."""
        return click.key

    def query_id_of_click(self, click: Record[Any]) -> str:
        """The id of the primary event the click refers to (default: `value["query_id"]`)."""
        return str(click.value["query_id"])

    def query_id(self, query: Record[Any]) -> str:
        """A primary record's id, as written to the EventStore (default: the record's key). It must be a
        Photon event id (`server:process:timestamp_ms:sequence`, see `millstream.photon.ids`): the
        EventStore finds a query in its log by the time inside its id."""
        return query.key

    def filter(self, query: Event, click: Event) -> bool:
        """False drops the pair before anything is registered (the click is counted as filtered)."""
        return True

    def project(self, query: Event, click: Event) -> Event:
        """The joined event made of the pair."""
        return {"query": query, "click": click}

    def enrich(self, joined: Event) -> Event:
        """Add what the joined event needs from elsewhere (default: nothing)."""
        return joined

    def join(self, query: Event, click: Event) -> Event | None:
        """filter, then project, then enrich; None when the pair is filtered out."""
        if not self.filter(query, click):
            return None
        return self.enrich(self.project(query, click))
