"""Every metric name and label of the exporter, the cached page they are served from, and the collector.

It sits at the end of the pipeline: OomEvents are recorded into EventCounts, the loop publishes each file's
read statistics into SourceTable as it reads them, and /metrics joins the cached bytes (its modules are in
docs/architecture.md, the one code map). A sample:

    # HELP sglang_oom_events_total SGLang OOM events seen in the logs, one per server-level failure.
    # TYPE sglang_oom_events_total counter
    sglang_oom_events_total{kind="<a kind id of the catalog>",source="sglang-0"} 1.0
    sglang_oom_exporter_files_watched 1.0

Why not prometheus_client Counters: the event counters continue from the state file after a restart (a Counter
cannot start at a value), the paging kinds are zero-initialised per source from the catalog, and a source's series
disappear once its logs are gone past the retention; and a scrape of 10,000 followed files must not walk 10,000
sources or wait for the loop. Each family keeps its lines encoded, so a scrape only joins bytes.
"""
