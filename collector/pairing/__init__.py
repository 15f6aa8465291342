"""Joining the two lines of sight: server spans and browser entries, paired by trace id into
the ``pairs`` table (docs/collector.md, Pairing).

- ``rules``: which spans belong to an entry, their hops, the derived parts, the pair rows
  (pure functions; the query API uses them too);
- ``lookups``: both sides of traces read back from the store by trace id;
- ``trace_index``: which trace ids the embedded store holds, answered from memory;
- ``pairer``: the background rounds that pair what the writer hands over.
"""
