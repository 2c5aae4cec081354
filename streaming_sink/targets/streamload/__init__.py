"""The Stream Load kit: what the StarRocks and Doris targets share, written once.

* `http`: the HTTP client that follows an FE's 307 to a BE and re-sends credentials and body;
* `fe`: the FE's answers (`Answer`, both dialects), label states (`LabelState`) and the read-only
  `FeClient` (label state, start-up probe);
* `accounting`: the check that a load's rows add up to what was sent;
* `table_schema`: a table's columns from the FE's `_schema` endpoint;
* `target`: `StreamLoadTarget`, the options both take (HTTP settings and backoff included) and how they
  are checked, their outage limits and the outcome of a commit whose label the FE forgot;
* `doris_arrow`: Doris' Arrow IPC load format, the one piece here that only one product uses.

The two products' two-phase-commit state machines differ and stay in `targets/starrocks.py` and
`targets/doris.py`. Wire facts: docs/protocol.md.
"""
