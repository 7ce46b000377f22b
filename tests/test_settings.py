"""common.settings: typed, bounded, validated at start; a bad or unknown GSAGE_* variable is named."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest

from common.bento.launch import START_HTTP_SERVER
from common.settings import SettingsError, load_settings, markdown_table

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "name, value, reason",
    [
        ("GSAGE_COALESCE_MAX_INFLIGHT", "0", "greater than or equal to 1"),  # used to hang the coalescer
        ("GSAGE_TRACING", "enabled", "valid boolean"),  # used to read as off
        (
            "GSAGE_BACKEND",
            "onxx",
            "'onnx', 'onnx-cuda', 'openvino', 'torch' or 'tensorrt'",
        ),  # failed only when a model loaded
        ("GSAGE_FEATURE_TRANSPORT_DTYPE", "bf16", "'float32' or 'float16'"),  # turned every request into a 400
        ("GSAGE_FANOUT", "25,x", "valid integer"),
        ("GSAGE_FANOUT", "0", "greater than or equal to 1"),
        ("GSAGE_L1_TTL_S", "-1", "greater than 0"),
        ("GSAGE_COALESCE_OVERLAP_RATIO", "0", "greater than 0"),
        ("GSAGE_MAX_BATCH_TARGETS", "0", "greater than or equal to 1"),
        ("GSAGE_RATE_LIMIT_PER_S", "nan", "finite number"),
        ("GSAGE_GRPC_PORT", "70000", "less than or equal to 65535"),
        ("GSAGE_REDIS_URL", "http://127.0.0.1:6379", "not a redis URL"),
        ("GSAGE_GRAPH_LOG_REDIS_URL", "redis-log:6379", "not a redis URL"),
        ("GSAGE_API_KEYS_FILE", "/no/such/keys.json", "not a readable file"),
        ("GSAGE_SERVICE_TOKENS", "a,b,c", "at most 2"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_reason(name, value, reason):
    with pytest.raises(SettingsError) as info:
        load_settings({name: value})
    message = str(info.value)
    assert f"{name}={value!r}" in message and reason in message, message


def test_an_unknown_variable_is_refused_with_a_suggestion():
    with pytest.raises(SettingsError, match=r"unknown setting GSAGE_BACKEN \(did you mean GSAGE_BACKEND"):
        load_settings({"GSAGE_BACKEN": "onnx"})
    with pytest.raises(SettingsError, match="GSAGE_NO_SUCH_THING"):
        load_settings({"GSAGE_NO_SUCH_THING": "1", "GSAGE_FANOUT": "5"})
    # Not service settings: the gRPC CLI's key and the load generators' knobs; other prefixes.
    load_settings({"GSAGE_API_KEY": "k", "GSAGE_BENCH_NODES": "3", "BENTOML_HOME": "/x", "OTHER": "y"})


def test_values_parse_from_the_environment():
    s = load_settings(
        {
            "GSAGE_FANOUT": " 10, 5 ",
            "GSAGE_MODEL_TAGS": "graphsage:a,graphsage:b",
            "GSAGE_ACCESS_LOG": "off",
            "GSAGE_PREMEAN": "1",
            "GSAGE_COALESCE_OVERLAP_RATIO": "inf",
            "gsage_l1_bytes": "0",
        }
    )
    assert s.fanout == (10, 5) and s.model_tags == ("graphsage:a", "graphsage:b")
    assert s.access_log is False and s.premean is True and math.isinf(s.coalesce_overlap_ratio) and s.l1_bytes == 0
    with pytest.raises(SettingsError):
        load_settings({"GSAGE_MODEL_TAGS": ","})  # no tag at all


def test_each_owner_gets_its_section_and_a_retired_variable_only_warns():
    from common.settings import SECTIONS, FeatureCacheSection, RunnerCallsSection, Settings

    s = load_settings({"GSAGE_L1_BYTES": "123", "GSAGE_RUNNER_TIMEOUT_S": "4"})
    cache = s.section(FeatureCacheSection)
    assert type(cache) is FeatureCacheSection and cache.l1_bytes == 123 and s.feature_cache is cache
    assert s.runner_calls.model_call_timeout_s == 3.0 and isinstance(s.runner_calls, RunnerCallsSection)
    fields = [name for section in SECTIONS for name in section.model_fields]
    assert sorted(fields) == sorted(Settings.model_fields) and len(fields) == len(set(fields))  # each in one section
    with pytest.warns(UserWarning, match="GSAGE_DIRECT_API is set but no longer has an effect"):
        assert load_settings({"GSAGE_DIRECT_API": "0"}).fanout == (25, 10)


def test_defaults_run_on_a_laptop():
    s = load_settings({})
    assert s.redis_url == "" and not s.auth_enabled and s.bind_host == "127.0.0.1"
    assert s.backend == "onnx" and s.fanout == (25, 10)


def test_cross_field_rules(tmp_path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(SettingsError, match="GSAGE_TLS_KEY_FILE is missing"):
        load_settings({"GSAGE_TLS_CERT_FILE": str(cert)})
    with pytest.raises(SettingsError, match="GSAGE_API_KEYS_FILE is empty"):
        load_settings({"GSAGE_AUTH_ENABLED": "1"})
    with pytest.raises(
        SettingsError, match=r"GSAGE_SHADOW_BATCH_NODES \(300\) is over GSAGE_COALESCE_MAX_NODES \(200\)"
    ):
        load_settings({"GSAGE_SHADOW_BATCH_NODES": "300", "GSAGE_COALESCE_MAX_NODES": "200"})
    keys = tmp_path / "keys.json"
    keys.write_text("[]")
    s = load_settings({"GSAGE_AUTH_ENABLED": "1", "GSAGE_API_KEYS_FILE": str(keys)})
    assert s.bind_host == "0.0.0.0"  # with auth on, all interfaces (the container path)
    assert load_settings({"GSAGE_HOST": "0.0.0.0"}).bind_host == "0.0.0.0"  # said explicitly


def test_the_update_log_may_have_a_redis_of_its_own():
    """The cache may evict and forget; the log has its own server where one is given."""
    both = load_settings(
        {"GSAGE_REDIS_URL": "redis+cluster://cache:6379", "GSAGE_GRAPH_LOG_REDIS_URL": "redis://redis-log:6379/0"}
    )
    assert both.graph_log_kind == "redis" and both.graph_log_url == "redis://redis-log:6379/0"
    assert both.redis_url == "redis+cluster://cache:6379"  # the cache's own, untouched
    cache_only = load_settings({"GSAGE_REDIS_URL": "redis://cache:6379/0"})
    assert cache_only.graph_log_kind == "redis" and cache_only.graph_log_url == "redis://cache:6379/0"
    log_only = load_settings({"GSAGE_GRAPH_LOG_REDIS_URL": "redis://redis-log:6379/0"})
    assert log_only.graph_log_kind == "redis" and log_only.redis_url == ""  # a log in Redis, no L2
    assert load_settings({}).graph_log_kind == "file"
    for kind in ("file", "redis"):  # said explicitly
        assert (
            load_settings({"GSAGE_GRAPH_LOG": kind, "GSAGE_GRAPH_LOG_REDIS_URL": "redis://l:6379/0"}).graph_log_kind
            == kind
        )
    with pytest.raises(SettingsError, match="GSAGE_GRAPH_LOG=redis needs GSAGE_GRAPH_LOG_REDIS_URL or GSAGE_REDIS_URL"):
        load_settings({"GSAGE_GRAPH_LOG": "redis"})


def test_the_readme_table_is_generated_from_the_fields():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- settings-table:start -->\n(.*?)<!-- settings-table:end -->", readme, re.S)
    assert block, "README.md lacks the generated settings table markers"
    assert block.group(1) == markdown_table(), "README's table is stale: run `python -m common.settings`"
    assert "None" not in markdown_table()  # every field has a description


@pytest.mark.integration
def test_a_bad_setting_stops_the_start_with_its_name(tmp_path):
    """A service started with a bad value exits at once, and its output names the variable."""
    env = {
        **os.environ,
        "BENTOML_HOME": str(tmp_path),
        "BENTOML_DO_NOT_TRACK": "true",
        "GSAGE_COALESCE_MAX_INFLIGHT": "0",
    }
    out = subprocess.run(
        [*START_HTTP_SERVER, "services.gateway:Gateway", "--service-name", "GraphSAGERunner", "--port", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "GSAGE_COALESCE_MAX_INFLIGHT='0': Input should be greater than or equal to 1" in out.stdout + out.stderr
