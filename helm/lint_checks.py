"""Checks of helm/lint.sh that need a parser: chart values against Notify's
settings, and rendered manifests against Notify's settings and metrics. Run
by lint.sh; needs PyYAML, promql-parser and Python >= 3.11 (tomllib).
SOURCE_ROOT is a Notify checkout (the chart's own, ..).

  lint_checks.py config-values SOURCE_ROOT VALUES_YAML [--allow-defaults]
      Fails when `config` in VALUES_YAML names a setting that does not exist
      in services/core/default.toml, or, unless --allow-defaults, restates a
      built-in default: values.yaml overrides only what a cluster needs, so
      that changing a default in Notify reaches every deploy.
  lint_checks.py rendered SOURCE_ROOT MANIFESTS_YAML
      Every document parses and has apiVersion, kind and a name; every config
      file in a Secret parses as TOML and names only existing settings; every
      PrometheusRule expression parses as PromQL and names only metrics the
      services' sources record; every cert-manager Certificate writes a
      Secret a Deployment mounts and names the host helm test dials.
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
    "database.shards": ("services/core/src/**/*.rs", "ShardSettings"),
    "database.bucket_ranges": ("shard-router/src/**/*.rs", "BucketRange"),
    "auth.clients": ("services/core/src/**/*.rs", "ClientSettings"),
}

# Keys of the chart's Secrets that hold a Notify config file.
CONFIG_KEYS = ("notify.toml", "notify-api.toml")


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
    path = pathlib.Path(source_root) / "services/core/src/auth.rs"
    text = path.read_text() if path.exists() else ""
    return set(re.findall(r'Scope::\w+ => "([a-z._]+)"', text))


def load_defaults(source_root):
    with open(pathlib.Path(source_root) / "services/core/default.toml", "rb") as f:
        return tomllib.load(f)


def recorded_metrics(source_root):
    """Names of the notify_* metrics the services record (string literals)."""
    names = set()
    for path in (pathlib.Path(source_root) / "services").glob("*/src/**/*.rs"):
        names.update(re.findall(r'"(notify_[a-z0-9_]+)"', path.read_text()))
    return names


def check_rule(rule, metrics, errors, where):
    import promql_parser

    expr = rule.get("expr", "")
    try:
        promql_parser.parse(expr)
    except Exception as e:  # the parser raises plain exceptions
        errors.append(f"{where} {rule.get('alert')}: not PromQL: {e}")
        return
    for name in re.findall(r"\b(notify_[a-z0-9_]+)", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in metrics and base not in metrics:
            errors.append(f"{where} {rule.get('alert')}: no service records the metric {name}")


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
    certificates = []
    for d in docs:
        assert isinstance(d, dict) and d.get("apiVersion") and d.get("kind"), d
        name = d.get("metadata", {}).get("name")
        assert name, d
        if d["kind"] == "PrometheusRule":
            metrics = metrics if metrics is not None else recorded_metrics(source_root)
            for group in d["spec"]["groups"]:
                for rule in group["rules"]:
                    check_rule(rule, metrics, errors, f"PrometheusRule {name}")
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
    for error in errors:
        print(error)
    print(f"{len(docs)} documents, {files} config files, {len(certificates)} Certificates")
    return not errors


def schema(source_root, schema_json):
    with open(schema_json) as f:
        client = json.load(f)["properties"]["auth"]["properties"]["clients"]["items"]
    errors = []
    want = item_fields(source_root)["auth.clients"]
    have = set(client["properties"])
    if want is None:
        errors.append("auth.clients fields: no struct ClientSettings in services/core/src")
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
    if len(argv) == 4 and argv[1] == "schema":
        return schema(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return False


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv) else 1)
