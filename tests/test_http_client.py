"""The one HTTP client (sources/http.py): its reasons, the callers' labels they map to, and one deadline per call.

The SGLang scrape's own behaviour tests (a dead or lying endpoint, an oversized body) are in test_scrape.py, the
API server's in test_kubeapi.py and test_kube_events.py; this file holds what the client owns.
"""

from __future__ import annotations

import time

import pytest

from sglang_oom_exporter.kubeevents.poster import RESULTS
from sglang_oom_exporter.sources import kubeclient, scrape
from sglang_oom_exporter.sources.http import LABELS, HttpError, Labels, Reason, bearer, request, tls_context
from tests.support.fake_kubeapi import pod
from tests.support.kubeapi import NODE, api_client


def test_every_reason_maps_to_a_label_each_caller_already_exports():
    assert set(LABELS) == set(Reason)
    for labels in LABELS.values():
        assert labels.scrape in scrape.REASONS
        assert labels.server_info in scrape.REASONS
        assert labels.discovery in kubeclient.REASONS
        assert labels.k8s_events in RESULTS


def test_the_mapping_keeps_each_callers_names():
    # The metric label values are a public interface older than the client: the Events poster says unreachable
    # and http_error, the scrape (which never spoke TLS errors) error, discovery its own bad_json.
    assert {
        Reason.TIMEOUT: Labels("timeout", "timeout", "timeout", "timeout"),
        Reason.REFUSED: Labels("refused", "refused", "refused", "unreachable"),
        Reason.TLS: Labels("error", "error", "tls", "tls"),
        Reason.NO_TOKEN: Labels("error", "error", "no_token", "no_token"),
        Reason.TOO_LARGE: Labels("too_large", "too_large", "too_large", "error"),
        Reason.HTTP_STATUS: Labels("http_status", "http_status", "http_status", "http_error"),
        Reason.TRUNCATED: Labels("truncated", "truncated", "error", "error"),
        Reason.BAD_BODY: Labels("not_metrics", "bad_json", "bad_json", "error"),
        Reason.ERROR: Labels("error", "error", "error", "error"),
    } == LABELS


def test_a_missing_ca_is_a_tls_reason_and_an_empty_token_a_no_token_one(tmp_path):
    with pytest.raises(HttpError) as info:
        tls_context(str(tmp_path / "ca.crt"))
    assert info.value.reason is Reason.TLS
    (tmp_path / "token").write_text("\n")
    with pytest.raises(HttpError) as info:
        bearer(str(tmp_path / "token"))
    assert (info.value.reason, info.value.detail) == (Reason.NO_TOKEN, f"{tmp_path}/token is empty")
    (tmp_path / "token").write_text("tok-1\n")
    assert bearer(str(tmp_path / "token")) == {"Authorization": "Bearer tok-1"}


def test_an_https_call_to_an_untrusted_server_is_a_tls_reason(api, tls):
    with pytest.raises(HttpError) as info:
        request("GET", f"https://127.0.0.1:{api.port}/api/v1/pods", timeout=5.0, max_bytes=1 << 20)
    assert info.value.reason is Reason.TLS  # the system's CAs do not know the fake's throwaway one
    assert api.calls == []


def test_an_api_server_that_drips_its_answer_times_out_at_the_whole_calls_deadline(api, tls):
    api.pods = [pod("llm", f"llama-{i}", f"10.0.0.{i}") for i in range(3)]
    api.mode = "slow_drip"  # every read returns within 0.1 s; the whole list would take over a minute
    started = time.monotonic()
    with pytest.raises(HttpError) as info:
        api_client(api, tls, timeout=1.0).list_pods(NODE)  # was: a per-read timeout, so the list took minutes
    took = time.monotonic() - started
    assert LABELS[info.value.reason].discovery == "timeout"
    assert 1.0 <= took < 10.0
