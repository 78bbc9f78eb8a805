"""Checks of helm/lint.sh that need a parser: chart values against Notify's
settings, and rendered manifests against Notify's settings and metrics. Run
by lint.sh; needs PyYAML, promql-parser and Python >= 3.11 (tomllib).
SOURCE_ROOT is a Notify checkout (the chart's own, ..).

  lint_checks.py config-values SOURCE_ROOT VALUES_YAML [--allow-defaults]
      Fails when `config` in VALUES_YAML names a setting that does not exist
      in services/domain/default.toml, or, unless --allow-defaults, restates a
      built-in default: values.yaml overrides only what a cluster needs, so
      that changing a default in Notify reaches every deploy.
  lint_checks.py rendered SOURCE_ROOT MANIFESTS_YAML
      Every document parses and has apiVersion, kind and a name; every config
      file in a Secret parses as TOML and names only existing settings; every
      PrometheusRule expression parses as PromQL and names only metrics the
      services' sources record; every Grafana dashboard in a ConfigMap
      (<fullname>-dashboard) passes the dashboard check below; every pod (Deployments, Jobs, the
      helm test Pod) runs non-root with RuntimeDefault seccomp, and each of
      its containers has a read-only root file system, no privilege
      escalation, ALL capabilities dropped, CPU and memory requests and a
      memory limit; every cert-manager Certificate writes a Secret a
      Deployment mounts and names the host helm test dials; every pod
      mounts only keys the chart's Secrets hold; every api, worker and edge
      Deployment binds its ports beyond loopback as its config file says,
      probes GET /healthz (startup, liveness) and /readyz (readiness) on its
      metrics port, and gives its pods a terminationGracePeriodSeconds above
      the preStop sleep plus shutdown_grace_secs.
  lint_checks.py dashboard SOURCE_ROOT DASHBOARD_JSON
      The Grafana dashboard parses, its panel ids are unique, every query
      parses as PromQL (Grafana's variables replaced by sample values) and
      names only metrics the services' sources record, queried the way the
      services export them (summaries: quantile="..."; histograms with
      buckets: _bucket), and every variable's query names recorded metrics.
  lint_checks.py schema SOURCE_ROOT VALUES_SCHEMA_JSON
      The schema's auth.clients fields and scopes are those of Notify's
      ClientSettings and Scope.
"""

import base64
import json
import pathlib
import re
import sys
import tomllib

import yaml

# The array-of-tables settings, whose fields default.toml cannot show by
# example (its lists are empty or carry only some fields): the Rust struct of
# one item, and where it is defined.
ITEM_STRUCTS = {
    "database.shards": ("services/domain/src/**/*.rs", "ShardSettings"),
    "database.bucket_ranges": ("shard-router/src/**/*.rs", "BucketRange"),
    "auth.clients": ("services/domain/src/**/*.rs", "ClientSettings"),
    "edge.tokens.keys": ("services/domain/src/**/*.rs", "EdgeKeySettings"),
}

# Keys of the chart's Secrets that hold a Notify config file.
CONFIG_KEYS = ("notify.toml", "notify-api.toml", "notify-edge.toml")

# The chart's long-running processes, by the command of their container:
# the config section holding their listen addresses, the container port
# each address must bind (named port: setting), and the setting that bounds
# their drain after SIGTERM (None: the process has none).
PROCESSES = {
    "notify-api": ("api", {"grpc": "listen", "metrics": "metrics_listen"}, "shutdown_grace_secs"),
    "notify-worker": ("worker", {"metrics": "metrics_listen"}, None),
    "notify-edge": ("edge", {"http": "listen", "metrics": "metrics_listen"}, "shutdown_grace_secs"),
}


def walk(values, defaults, path, prefix, allow_defaults, errors, fields):
    """Compares a (YAML or TOML) table with the same table of default.toml."""
    for key, value in values.items():
        name = f"{path}.{key}" if path else key
        if value is None:  # left out of the rendered file
            continue
        if key not in defaults:
            errors.append(f"{prefix}{name}: no such setting in default.toml")
            continue
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                errors.append(f"{prefix}{name}: must be a table of settings")
                continue
            walk(value, default, name, prefix, allow_defaults, errors, fields)
            continue
        if name in fields and fields[name] is None and value:
            pattern, struct = ITEM_STRUCTS[name]
            errors.append(f"{prefix}{name}: no struct {struct} in {pattern} to check its fields")
        elif name in fields and isinstance(value, list):
            for index, item in enumerate(value):
                unknown = sorted(set(item) - fields[name]) if isinstance(item, dict) else []
                for field in unknown:
                    errors.append(f"{prefix}{name}[{index}].{field}: no such field")
        if not allow_defaults and value == default and type(value) is type(default):
            errors.append(
                f"{prefix}{name}: {value!r} is the built-in default; leave it out of values.yaml"
            )


def struct_fields(source_root, pattern, name):
    """The `pub` field names of a Rust struct with named fields, or None."""
    for path in sorted(pathlib.Path(source_root).glob(pattern)):
        match = re.search(
            r"pub struct " + name + r" \{(.*?)\n\}", path.read_text(), re.DOTALL
        )
        if match:
            return set(re.findall(r"^\s*pub (\w+):", match.group(1), re.MULTILINE))
    return None


def item_fields(source_root):
    """Fields per array-of-tables setting; a struct missing from the sources
    maps to None (and is reported where the setting is used)."""
    return {
        setting: struct_fields(source_root, pattern, name)
        for setting, (pattern, name) in ITEM_STRUCTS.items()
    }


def scope_names(source_root):
    path = pathlib.Path(source_root) / "services/domain/src/scope.rs"
    text = path.read_text() if path.exists() else ""
    return set(re.findall(r'Scope::\w+ => "([a-z._]+)"', text))


def load_defaults(source_root):
    with open(pathlib.Path(source_root) / "services/domain/default.toml", "rb") as f:
        return tomllib.load(f)


def recorded_metrics(source_root):
    """Names of the notify_* metrics the services record (string literals)."""
    names = set()
    for path in (pathlib.Path(source_root) / "services").glob("*/src/**/*.rs"):
        names.update(re.findall(r'"(notify_[a-z0-9_]+)"', path.read_text()))
    return names


def exports_buckets(source_root):
    """Whether the services give their histograms buckets. Without
    (PrometheusBuilder's default) metrics-exporter-prometheus renders each
    histogram as a summary: quantile="0.99" series, no _bucket series."""
    return any(
        "set_buckets" in path.read_text()
        for path in (pathlib.Path(source_root) / "services").glob("*/src/**/*.rs")
    )


def unrecorded_metrics(expr, metrics):
    """The notify_* names in expr that no service records (a histogram's or
    summary's _bucket, _sum and _count series count as its own)."""
    names = re.findall(r"\b(notify_[a-z0-9_]+)", expr)
    return [
        name
        for name in names
        if name not in metrics and re.sub(r"_(bucket|sum|count)$", "", name) not in metrics
    ]


def check_rule(rule, metrics, errors, where):
    import promql_parser

    expr = rule.get("expr", "")
    try:
        promql_parser.parse(expr)
    except Exception as e:  # the parser raises plain exceptions
        errors.append(f"{where} {rule.get('alert')}: not PromQL: {e}")
        return
    for name in unrecorded_metrics(expr, metrics):
        errors.append(f"{where} {rule.get('alert')}: no service records the metric {name}")


# Grafana's built-in interval variables, replaced by a duration so that a
# dashboard query parses as PromQL; the dashboard's own variables become a
# plain word (they stand inside label matchers).
GRAFANA_DURATIONS = ("__rate_interval", "__interval", "__range")


def grafana_sample(expr):
    expr = re.sub(
        r"\$\{?(" + "|".join(GRAFANA_DURATIONS) + r")(?::\w+)?\}?", "5m", expr
    )
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", "sample", expr)


def dashboard_panels(panels):
    """Every panel, those inside rows included."""
    for panel in panels or []:
        yield panel
        yield from dashboard_panels(panel.get("panels"))


def check_dashboard(dashboard, metrics, buckets, errors, where):
    """A Grafana dashboard (parsed JSON) against the recorded metrics."""
    import promql_parser

    if not dashboard.get("uid") or not dashboard.get("title"):
        errors.append(f"{where}: no uid or title")
    ids = [p.get("id") for p in dashboard_panels(dashboard.get("panels"))]
    for panel_id in sorted({i for i in ids if ids.count(i) > 1}, key=str):
        errors.append(f"{where}: panel id {panel_id} is used twice")
    queries = 0
    for panel in dashboard_panels(dashboard.get("panels")):
        if panel.get("type") == "row":
            continue
        title = f"{where} panel {panel.get('title')!r}"
        targets = [t for t in panel.get("targets") or [] if t.get("expr")]
        if not targets:
            errors.append(f"{title}: no query")
        for target in targets:
            queries += 1
            expr = target["expr"]
            try:
                promql_parser.parse(grafana_sample(expr))
            except Exception as e:  # the parser raises plain exceptions
                errors.append(f"{title}: not PromQL: {expr}: {e}")
                continue
            for name in unrecorded_metrics(expr, metrics):
                errors.append(f"{title}: no service records the metric {name}")
            if buckets and "quantile=" in expr:
                errors.append(
                    f"{title}: the services give histograms buckets, so there is no "
                    f"quantile series: use histogram_quantile over _bucket: {expr}"
                )
            if not buckets and re.search(r"_bucket\b|histogram_quantile", expr):
                errors.append(
                    f"{title}: the services export histograms as summaries (no buckets): "
                    f'use quantile="0.99", not _bucket: {expr}'
                )
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        if variable.get("type") != "query":
            continue
        for name in unrecorded_metrics(query, metrics):
            errors.append(
                f"{where} variable {variable.get('name')}: no service records the metric {name}"
            )
    if not queries:
        errors.append(f"{where}: no query at all")
    return queries


# What every container of the chart's pods must say (values.yaml's
# securityContext), and the pod-level settings (podSecurityContext) that a
# container may also set itself.
CONTAINER_SECURITY = {
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
}


def pod_specs(doc):
    kind = doc["kind"]
    if kind == "Pod":
        return [doc["spec"]]
    if kind in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [doc["spec"]["template"]["spec"]]
    if kind == "CronJob":
        return [doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def check_pod_security(doc, errors):
    """Non-root, RuntimeDefault seccomp, read-only root file system, no
    privilege escalation, ALL capabilities dropped, requests and a memory
    limit: on every container of every pod the chart renders."""
    where = f"{doc['kind']} {doc['metadata']['name']}"
    for spec in pod_specs(doc):
        pod = spec.get("securityContext") or {}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            name = f"{where} container {container.get('name')}"
            sc = container.get("securityContext") or {}
            for key, want in CONTAINER_SECURITY.items():
                if sc.get(key) is not want:
                    errors.append(f"{name}: securityContext.{key} is not {str(want).lower()}")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                errors.append(f"{name}: securityContext.capabilities.drop lacks ALL")
            if sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
                errors.append(f"{name}: runAsNonRoot is not true")
            seccomp = sc.get("seccompProfile", pod.get("seccompProfile")) or {}
            if seccomp.get("type") != "RuntimeDefault":
                errors.append(f"{name}: seccompProfile is not RuntimeDefault")
            resources = container.get("resources") or {}
            requests = resources.get("requests") or {}
            for resource in ("cpu", "memory"):
                if resource not in requests:
                    errors.append(f"{name}: no resources.requests.{resource}")
            if "memory" not in (resources.get("limits") or {}):
                errors.append(f"{name}: no resources.limits.memory")


def merged(defaults, values):
    """default.toml with a config file's tables laid over it."""
    out = dict(defaults)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def secret_items(spec):
    """(volume name, Secret name, key) of every Secret item a pod mounts."""
    for volume in spec.get("volumes") or []:
        secret = volume.get("secret")
        if secret:
            for item in secret.get("items") or []:
                yield volume["name"], secret["secretName"], item["key"]
        for source in (volume.get("projected") or {}).get("sources") or []:
            secret = source.get("secret")
            if secret:
                for item in secret.get("items") or []:
                    yield volume["name"], secret["name"], item["key"]


def pod_config(spec, secrets):
    """The config file a pod reads (the item of its config volume, or of the
    template its init container joins), parsed, or None when it comes from a
    Secret the chart does not render (secrets.existingConfigSecret)."""
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    volume = volumes.get("config") or {}
    if "secret" not in volume:
        volume = volumes.get("config-template") or {}
    secret = volume.get("secret") or {}
    data = secrets.get(secret.get("secretName"))
    if data is None:
        return None
    for item in secret.get("items") or []:
        if item.get("path") == "notify.toml" and item["key"] in data:
            return tomllib.loads(base64.b64decode(data[item["key"]]).decode())
    return None


def check_processes(docs, defaults, errors):
    """Every pod mounts only keys its chart-rendered Secrets hold; every api,
    worker and edge Deployment binds its config file's listen addresses
    beyond loopback on its container ports, has a startup probe, a liveness
    probe on GET /healthz and a readiness probe on GET /readyz (or gRPC
    health) of its metrics port, and a terminationGracePeriodSeconds above
    its preStop sleep plus the drain its config file allows."""
    secrets = {
        d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "Secret"
    }
    for d in docs:
        where = f"{d['kind']} {d['metadata']['name']}"
        for spec in pod_specs(d):
            for volume, secret, key in secret_items(spec):
                if secret in secrets and key not in secrets[secret]:
                    errors.append(f"{where} volume {volume}: Secret {secret} has no key {key}")
        if d["kind"] != "Deployment":
            continue
        spec = d["spec"]["template"]["spec"]
        for container in spec.get("containers") or []:
            process = PROCESSES.get((container.get("command") or [None])[0])
            if process is None:
                continue
            section, listeners, grace_setting = process
            name = f"{where} container {container['name']}"
            config = pod_config(spec, secrets)
            settings = merged(defaults, config or {})[section]
            ports = {p["name"]: p["containerPort"] for p in container.get("ports") or []}
            for port, setting in listeners.items() if config is not None else ():
                address = settings[setting]
                host, _, bound = address.rpartition(":")
                if port not in ports:
                    errors.append(f"{name}: no container port {port} for {section}.{setting}")
                elif bound != str(ports[port]):
                    errors.append(
                        f"{name}: {section}.{setting} is {address}, the container port {port} is {ports[port]}"
                    )
                if host.startswith("127.") or host in ("[::1]", "localhost"):
                    errors.append(f"{name}: {section}.{setting} binds loopback ({address})")
            if not container.get("startupProbe"):
                errors.append(f"{name}: no startupProbe")
            liveness = (container.get("livenessProbe") or {}).get("httpGet") or {}
            if (liveness.get("path"), liveness.get("port")) != ("/healthz", "metrics"):
                errors.append(f"{name}: livenessProbe is not GET /healthz on the metrics port")
            readiness = container.get("readinessProbe") or {}
            http = readiness.get("httpGet") or {}
            if (http.get("path"), http.get("port")) != ("/readyz", "metrics") and not (
                "grpc" in readiness and section == "api"
            ):
                errors.append(f"{name}: readinessProbe is not GET /readyz on the metrics port")
            if grace_setting is None:
                continue
            command = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get(
                "command"
            ) or []
            sleep = int(command[1]) if command[:1] == ["sleep"] and len(command) == 2 else 0
            drain = settings[grace_setting]
            period = spec.get("terminationGracePeriodSeconds", 30)
            if period <= sleep + drain:
                errors.append(
                    f"{name}: terminationGracePeriodSeconds {period} is not above the preStop "
                    f"sleep ({sleep}) + {section}.{grace_setting} ({drain})"
                )


def config_values(source_root, values_yaml, allow_defaults):
    defaults = load_defaults(source_root)
    with open(values_yaml) as f:
        values = yaml.safe_load(f) or {}
    config = values.get("config") or {}
    errors = []
    if not isinstance(config, dict):
        errors.append("config: must be a map of sections")
    else:
        walk(config, defaults, "", "config.", allow_defaults, errors, item_fields(source_root))
    for error in errors:
        print(f"{values_yaml}: {error}")
    return not errors


def dns_name_covers(pattern, host):
    """Whether a certificate's DNS name (maybe *.wildcard) covers host."""
    if pattern.startswith("*."):
        head, _, rest = host.partition(".")
        return bool(head) and rest == pattern[2:]
    return pattern == host


def check_certificate(cert, docs, errors):
    """A cert-manager Certificate (no Kubernetes schema validates it) writes
    a Secret that a Deployment mounts, and its DNS names cover the host the
    helm test Pod dials over TLS."""
    where = f"Certificate {cert['metadata']['name']}"
    spec = cert.get("spec") or {}
    secret = spec.get("secretName")
    dns_names = spec.get("dnsNames") or []
    if not secret:
        errors.append(f"{where}: no spec.secretName")
    if not (spec.get("issuerRef") or {}).get("name"):
        errors.append(f"{where}: no spec.issuerRef.name")
    if not dns_names:
        errors.append(f"{where}: no spec.dnsNames")
    mounted = {
        (v.get("secret") or {}).get("secretName")
        for d in docs
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"].get("volumes") or []
    }
    if secret and secret not in mounted:
        errors.append(f"{where}: no Deployment mounts its Secret {secret}")
    for d in docs:
        if d["kind"] != "Pod":
            continue
        for c in d["spec"]["containers"]:
            for env in c.get("env") or []:
                url = env.get("value") or ""
                if env["name"] != "NOTIFY_ADDR" or not url.startswith("https://"):
                    continue
                host = url.removeprefix("https://").rsplit(":", 1)[0]
                if not any(dns_name_covers(n, host) for n in dns_names):
                    errors.append(
                        f"{where}: Pod {d['metadata']['name']} dials {host}, "
                        f"which is not among its dnsNames {dns_names}"
                    )


def rendered(source_root, manifests):
    defaults = load_defaults(source_root)
    fields = item_fields(source_root)
    metrics = None
    with open(manifests) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert docs, "nothing rendered"
    errors = []
    files = 0
    dashboards = 0
    certificates = []
    for d in docs:
        assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind"), d
        name = d.get("metadata", {}).get("name")
        assert name, d
        check_pod_security(d, errors)
        if d["kind"] == "PrometheusRule":
            metrics = metrics if metrics is not None else recorded_metrics(source_root)
            for group in d["spec"]["groups"]:
                for rule in group["rules"]:
                    check_rule(rule, metrics, errors, f"PrometheusRule {name}")
        # The dashboard ConfigMap (the edge's key ConfigMap holds JSON too).
        if d["kind"] == "ConfigMap" and name.endswith("-dashboard"):
            for key, data in (d.get("data") or {}).items():
                if not key.endswith(".json"):
                    continue
                metrics = metrics if metrics is not None else recorded_metrics(source_root)
                dashboards += 1
                where = f"ConfigMap {name} {key}"
                try:
                    dashboard = json.loads(data)
                except ValueError as e:
                    errors.append(f"{where}: not JSON: {e}")
                    continue
                check_dashboard(
                    dashboard, metrics, exports_buckets(source_root), errors, where
                )
        if d["kind"] == "Certificate":
            certificates.append(d)
        if d["kind"] != "Secret":
            continue
        for key in CONFIG_KEYS:
            data = (d.get("data") or {}).get(key)
            if data is None:
                continue
            files += 1
            toml = tomllib.loads(base64.b64decode(data).decode())
            assert toml["api"]["listen"].rsplit(":", 1)[1].isdigit(), toml["api"]
            assert toml["log"]["format"] in ("json", "pretty"), toml["log"]
            walk(toml, defaults, "", f"Secret {name} {key}: ", True, errors, fields)
    for cert in certificates:
        check_certificate(cert, docs, errors)
    check_processes(docs, defaults, errors)
    for error in errors:
        print(error)
    print(
        f"{len(docs)} documents, {files} config files, {dashboards} dashboards, "
        f"{len(certificates)} Certificates"
    )
    return not errors


def dashboard(source_root, dashboard_json):
    with open(dashboard_json) as f:
        try:
            parsed = json.load(f)
        except ValueError as e:
            print(f"{dashboard_json}: not JSON: {e}")
            return False
    errors = []
    queries = check_dashboard(
        parsed,
        recorded_metrics(source_root),
        exports_buckets(source_root),
        errors,
        dashboard_json,
    )
    for error in errors:
        print(error)
    print(f"{queries} queries")
    return not errors


def schema(source_root, schema_json):
    with open(schema_json) as f:
        client = json.load(f)["properties"]["auth"]["properties"]["clients"]["items"]
    errors = []
    want = item_fields(source_root)["auth.clients"]
    have = set(client["properties"])
    if want is None:
        errors.append("auth.clients fields: no struct ClientSettings in services/domain/src")
    elif have != want:
        errors.append(
            f"auth.clients fields: schema {sorted(have)}, ClientSettings {sorted(want)}"
        )
    have = set(client["properties"]["scopes"]["items"]["enum"])
    want = scope_names(source_root)
    if have != want:
        errors.append(f"auth.clients scopes: schema {sorted(have)}, Scope {sorted(want)}")
    for error in errors:
        print(f"{schema_json}: {error}")
    return not errors


def main(argv):
    if len(argv) >= 4 and argv[1] == "config-values":
        return config_values(argv[2], argv[3], "--allow-defaults" in argv[4:])
    if len(argv) == 4 and argv[1] == "rendered":
        return rendered(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "dashboard":
        return dashboard(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "schema":
        return schema(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return False


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv) else 1)
