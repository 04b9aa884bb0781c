"""The chart's metrics: the ServiceMonitors (shaped as the Prometheus Operator's CRD
documents them), the scrape annotations, the network policy for Prometheus, the token's
service and role, and the Grafana dashboard, whose every expression names only metrics the
billing service or the hub exports."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from traitlets.config import Config

from meterhub.billing_hooks.hooks import SPAWNS_REFUSED
from meterhub.billing_hooks.meter import Meter
from meterhub.billing_hooks.metrics import BillingMetrics
from meterhub.billing_hooks.money import to_micros
from meterhub.billing_hooks.scopes import METRICS_SERVICE, metrics_role

from .billing_support import make_ledger
from .test_helm_chart import (
    CHART,
    DB,
    KUBERNETES_VERSIONS,
    _prefixed,
    by_kind,
    merged,
    objects,
)
from .test_meter import FakeHub


@pytest.fixture(scope="module")
def chart():
    import helm_python as helm

    with helm.Chart.load(CHART) as loaded:
        yield loaded


ON = {"billing": {"metrics": {"serviceMonitor": {"enabled": True}}}}

#: monitoring.coreos.com/v1 ServiceMonitor, the fields this chart sets, as the CRD documents
#: them (prometheus-operator 0.84, example/prometheus-operator-crd/
#: monitoring.coreos.com_servicemonitors.yaml); closed, so a misspelt field fails here
#: instead of being pruned by the API server
DURATION = (
    "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
SECRET_KEY_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["key"],
    "properties": {
        "key": {"type": "string"},
        "name": {"type": "string", "minLength": 1},
        "optional": {"type": "boolean"},
    },
}
ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "port": {"type": "string"},
        "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https"]},
        "interval": {"type": "string", "pattern": DURATION},
        "scrapeTimeout": {"type": "string", "pattern": DURATION},
        "authorization": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"type": {"type": "string"}, "credentials": SECRET_KEY_SELECTOR},
        },
    },
    "oneOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                        "matchExpressions": {"type": "array"},
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "jobLabel": {"type": "string"},
                "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
            },
        },
    },
}


def test_by_default_nothing_of_metrics_is_rendered(chart):
    found = by_kind(objects(chart, DB))
    assert not [key for key in found if key[0] == "ServiceMonitor"]
    assert ("ConfigMap", "meterhub-dashboard") not in found
    assert "annotations" not in found[("Service", "meterhub-billing")]["metadata"]
    (ingress,) = found[("NetworkPolicy", "meterhub-billing")]["spec"]["ingress"]


def test_service_monitors_scrape_billing_and_the_hub_with_the_read_metrics_token(chart):
    found = by_kind(objects(chart, merged(DB, ON)))
    billing = found[("ServiceMonitor", "meterhub-billing")]
    hub = found[("ServiceMonitor", "meterhub-hub")]
    for monitor in (billing, hub):
        jsonschema.validate(monitor, SERVICE_MONITOR)
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["authorization"] == {
            "type": "Bearer",
            "credentials": {"name": "hub", "key": f"hub.services.{METRICS_SERVICE}.apiToken"},
        }
        assert endpoint["interval"] == "60s"
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-lab"]}
    (endpoint,) = billing["spec"]["endpoints"]
    assert endpoint["path"] == "/services/billing/metrics"
    # the billing Service's port, and the labels of that Service
    service = found[("Service", "meterhub-billing")]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    selected = billing["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    (endpoint,) = hub["spec"]["endpoints"]
    assert endpoint["path"] == "/hub/metrics" and endpoint["targetPort"] == 8081
    assert hub["spec"]["selector"]["matchLabels"] == {
        "app": "jupyterhub",
        "component": "hub",
        "release": "gpu",
    }
    # the rest still validates on every Kubernetes version
    for obj in found.values():
        if obj["kind"] != "ServiceMonitor":
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(obj, version, strict=True)


def test_service_monitors_follow_the_base_url_the_prefix_and_an_existing_secret(chart):
    values = merged(
        _prefixed("lab", "lab-pool"),
        ON,
        {
            "billing": {
                "metrics": {
                    "serviceMonitor": {
                        "labels": {"release": "kps"},
                        "interval": "30s",
                        "hub": False,
                    },
                    "token": {"existingSecret": "prom-token"},
                }
            },
            "jupyterhub": {"hub": {"baseUrl": "/jupyter/"}},
        },
    )
    found = by_kind(objects(chart, values))
    assert ("ServiceMonitor", "lab-meterhub-hub") not in found
    monitor = found[("ServiceMonitor", "lab-meterhub-billing")]
    jsonschema.validate(monitor, SERVICE_MONITOR)
    assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/jupyter/services/billing/metrics"
    assert endpoint["interval"] == "30s"
    assert endpoint["authorization"]["credentials"] == {"name": "prom-token", "key": "token"}


@pytest.mark.parametrize("interval", ["1 min", "60", "-5s"])
def test_a_scrape_interval_prometheus_cannot_read_is_refused(chart, interval):
    values = merged(DB, {"billing": {"metrics": {"serviceMonitor": {"interval": interval}}}})
    with pytest.raises(Exception) as e:
        chart.render(values, name="gpu", namespace="gpu-lab")
    assert "interval" in str(e.value)


def test_annotations_and_prometheus_admitted_by_the_network_policy(chart):
    prometheus = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    values = merged(DB, {"billing": {"metrics": {"annotations": True, "scrapeFrom": prometheus}}})
    found = by_kind(objects(chart, values))
    service = found[("Service", "meterhub-billing")]
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/path": "/services/billing/metrics",
        "prometheus.io/port": "8082",
    }
    policy = found[("NetworkPolicy", "meterhub-billing")]
    servers, scrapers = policy["spec"]["ingress"]
    assert scrapers == {"ports": [{"port": "http"}], "from": prometheus}
    for obj in (service, policy):
        kubernetes_validate.validate(obj, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_token_is_a_service_whose_role_reads_metrics_only():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["jupyterhub"]["hub"]
    assert METRICS_SERVICE in values["services"]
    role = metrics_role()
    chart_role = values["loadRoles"][role["name"]]
    assert chart_role == {k: v for k, v in role.items() if k != "name"}


def test_the_rendered_path_is_the_one_the_billing_service_serves(chart, tmp_path):
    """The billing app, made with the prefix the chart gives the pod, answers the
    ServiceMonitor's path (403 without a token: the route exists, behind read:metrics)."""
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.testing import bind_unused_port

    from meterhub.billing_hooks.service import make_app

    from .test_helm_chart import _env, _pod

    values = merged(DB, ON, {"jupyterhub": {"hub": {"baseUrl": "/jupyter"}}})
    found = by_kind(objects(chart, values))
    (container,) = _pod(found[("Deployment", "meterhub-billing")])["containers"]
    prefix = _env(container)["JUPYTERHUB_SERVICE_PREFIX"]["value"]
    (endpoint,) = found[("ServiceMonitor", "meterhub-billing")]["spec"]["endpoints"]

    class Hub(FakeHub):
        async def user_exists(self, name):
            return False

        async def group_members(self, name):
            return None

    ledger, clock = make_ledger()

    async def scrape():
        sock, port = bind_unused_port()
        server = HTTPServer(make_app(prefix, ledger, 0, Hub(), Config(), [30]))
        server.add_sockets([sock])
        try:
            response = await AsyncHTTPClient().fetch(
                f"http://127.0.0.1:{port}{endpoint['path']}", raise_error=False
            )
        finally:
            server.stop()
        return response.code, json.loads(response.body)["message"]

    code, message = asyncio.run(scrape())
    assert code == 403 and "token" in message


# ------------------------------------------------------------ the Grafana dashboard

DASHBOARD = CHART / "dashboards" / "meterhub.json"
#: PromQL's functions, aggregations and keywords the dashboard may use
PROMQL = {
    "sum", "min", "max", "avg", "count", "by", "without", "rate", "increase", "irate",
    "histogram_quantile", "time", "clamp_min", "and", "or", "unless", "offset", "on",
    "absent", "delta",
}  # fmt: skip


async def exported() -> dict[str, set[str]]:
    """{sample name: its label names} of everything the billing service and the hub export
    with meterhub's names, each family filled in (a pass, an audit, a charge)."""
    ledger, clock = make_ledger()
    hub = FakeHub()
    meter = Meter(ledger, hub, interval_seconds=60, clock=clock)
    metrics = BillingMetrics(ledger, ("debug", "a800"), {"a800": 1}, meter, 3600)
    auth = ledger.open_session("ann", "", "a800", 1, to_micros("4.50"), min_seconds=60)
    ledger.mark_ready(auth.session_id)
    hub.servers[("ann", "")] = True
    clock.advance(60)
    await meter.tick()
    ledger.record_audit()
    SPAWNS_REFUSED.labels("credit")
    names: dict[str, set[str]] = {}
    for text in (metrics.exposition(), generate_latest(REGISTRY)):
        for family in text_string_to_metric_families(text.decode()):
            for sample in family.samples:
                if sample.name.startswith("meterhub_"):
                    names.setdefault(sample.name, set()).update(sample.labels)
    return names


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append(target["expr"])
    return found


def test_the_dashboard_has_the_four_views_the_issue_asks_for():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " / ".join(p["title"] for p in dashboard["panels"]).lower()
    for view in ("revenue per hour by profile", "gpu occupancy", "refused for credit", "meter"):
        assert view in titles
    assert dashboard["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def alert_rules() -> list[dict]:
    """The Prometheus rules docs/operations.md recommends ("Alerts worth setting")."""
    text = (CHART.parent.parent / "docs" / "operations.md").read_text()
    section = text.split("### Alerts worth setting", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (group,) = yaml.safe_load(block)["groups"]
    return group["rules"]


def test_the_documented_alerts_are_rules_on_exported_metrics():
    rules = alert_rules()
    names = {rule["alert"] for rule in rules}
    assert {"MeterhubMeterFailing", "MeterhubMeterStalled", "MeterhubAuditFailing"} <= names
    assert {"MeterhubWalletsAtZeroRising", "MeterhubGpusExhausted"} <= names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["annotations"]["summary"]
    check(asyncio.run(exported()), [rule["expr"] for rule in rules])


def test_every_dashboard_expression_names_only_what_is_exported():
    check(asyncio.run(exported()), expressions())


def check(names: dict[str, set[str]], exprs: list[str]) -> None:
    """Each PromQL expression names only exported metrics, PromQL's own words and labels
    those metrics carry."""
    for expr in exprs:
        bare = re.sub(r'"[^"]*"', '""', expr)
        metrics = set(re.findall(r"\bmeterhub_[a-z_]+", bare))
        assert metrics, expr
        unknown = metrics - set(names)
        assert not unknown, f"{expr}: not exported: {unknown}"
        labels = set().union(*(names[m] for m in metrics))
        for word in set(re.findall(r"\b[a-z_]+\b", bare)) - metrics - PROMQL:
            assert word in labels, f"{expr}: {word!r} is neither PromQL nor a label of {metrics}"
        for matcher in re.findall(r"\{([^}]*)\}", bare):
            for label in re.findall(r"([a-z_]+)\s*(?:=|!=|=~|!~)", matcher):
                assert label in labels, f"{expr}: no label {label!r}"


def test_the_dashboard_configmap_carries_the_file_for_grafanas_sidecar(chart):
    values = merged(DB, {"billing": {"metrics": {"dashboard": {"enabled": True}}}})
    configmap = by_kind(objects(chart, values))[("ConfigMap", "meterhub-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["meterhub.json"]) == json.loads(DASHBOARD.read_text())
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(configmap, version, strict=True)
