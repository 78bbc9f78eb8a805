{{/*
Chart name, truncated to the 63 characters a label value may hold.
*/}}
{{- define "notify.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix of every resource: <release>-<chart>, or <release> when the
release name already contains the chart name. Truncated for DNS names
(suffixes such as "-worker-metrics" still fit under 63 with a 47 limit).
*/}}
{{- define "notify.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "notify.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "notify.labels" -}}
helm.sh/chart: {{ include "notify.chart" . }}
{{ include "notify.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: notify
{{- end }}

{{/*
Selector labels shared by every component.
*/}}
{{- define "notify.selectorLabels" -}}
app.kubernetes.io/name: {{ include "notify.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of one component's resources. Call with (list $ "api").
*/}}
{{- define "notify.componentLabels" -}}
{{- $root := index . 0 }}
{{- include "notify.labels" $root }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
Selector labels of one component. Call with (list $ "api").
*/}}
{{- define "notify.componentSelectorLabels" -}}
{{- $root := index . 0 }}
{{- include "notify.selectorLabels" $root }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/*
ServiceAccount of the api and worker pods.
*/}}
{{- define "notify.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "notify.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Image reference: repository@digest, or repository:tag (tag defaults to appVersion).
*/}}
{{- define "notify.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}
{{- end }}

{{/*
Name of the chart-managed Secret (config file and urls).
*/}}
{{- define "notify.secretName" -}}
{{- include "notify.fullname" . }}
{{- end }}

{{/*
Name of the hook copy of that Secret, read by the migration Job.
*/}}
{{- define "notify.migrationSecretName" -}}
{{- printf "%s-migrate" (include "notify.fullname" .) }}
{{- end }}

{{/*
Whether the chart renders a Secret at all: not when both the config file and
the urls come from user-managed Secrets.
*/}}
{{- define "notify.createSecret" -}}
{{- if not (and .Values.secrets.existingConfigSecret .Values.secrets.existingSecret) }}true{{ end }}
{{- end }}

{{/*
A TOML key: bare when it can be, quoted otherwise.
*/}}
{{- define "notify.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . }}{{ . }}{{ else }}{{ toJson . }}{{ end }}
{{- end }}

{{/*
A TOML value from a values.yaml value. Numbers from YAML arrive as float64,
so whole numbers are printed as integers; strings are JSON-quoted (JSON string
escapes are valid TOML basic-string escapes); lists become arrays and maps
inline tables; null members are left out (TOML has no null).
*/}}
{{- define "notify.tomlValue" -}}
{{- $v := . }}
{{- if kindIs "string" $v }}
{{- toJson $v }}
{{- else if kindIs "float64" $v }}
{{- if eq $v (float64 (int64 $v)) }}{{ int64 $v }}{{ else }}{{ $v }}{{ end }}
{{- else if kindIs "slice" $v }}
{{- $items := list }}
{{- range $v }}
{{- if not (kindIs "invalid" .) }}
{{- $items = append $items (include "notify.tomlValue" .) }}
{{- end }}
{{- end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else if kindIs "map" $v }}
{{- $items := list }}
{{- range $k := keys $v | sortAlpha }}
{{- $e := get $v $k }}
{{- if not (kindIs "invalid" $e) }}
{{- $items = append $items (printf "%s = %s" (include "notify.tomlKey" $k) (include "notify.tomlValue" $e)) }}
{{- end }}
{{- end }}
{{- printf "{ %s }" (join ", " $items) }}
{{- else }}
{{- $v }}
{{- end }}
{{- end }}

{{/*
The config file /etc/notify/notify.toml: .Values.config section by section,
plus the listen addresses (from listenHost and the ports) and the per-shard
urls of secrets.shardUrls merged into database.shards.
*/}}
{{- define "notify.configToml" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- range $section := keys $cfg }}
{{- if not (kindIs "map" (get $cfg $section)) }}
{{- fail (printf "config.%s must be a map of settings (a [%s] table)" $section $section) }}
{{- end }}
{{- end }}
{{- $host := .Values.listenHost | default "0.0.0.0" }}
{{- $api := get $cfg "api" | default dict }}
{{- $_ := set $api "listen" (printf "%s:%d" $host (int .Values.api.ports.grpc)) }}
{{- $_ = set $api "metrics_listen" (printf "%s:%d" $host (int .Values.api.ports.metrics)) }}
{{- $_ = set $cfg "api" $api }}
{{- $worker := get $cfg "worker" | default dict }}
{{- $_ = set $worker "metrics_listen" (printf "%s:%d" $host (int .Values.worker.ports.metrics)) }}
{{- $_ = set $cfg "worker" $worker }}
{{- $shardUrls := .Values.secrets.shardUrls | default dict }}
{{- if $shardUrls }}
{{- $db := get $cfg "database" | default dict }}
{{- if not (get $db "shards") }}
{{- fail "secrets.shardUrls needs the shard list in config.database.shards" }}
{{- end }}
{{- $ids := list }}
{{- $shards := list }}
{{- range $s := get $db "shards" }}
{{- $s2 := deepCopy $s }}
{{- $id := toString (int64 $s.id) }}
{{- $ids = append $ids $id }}
{{- with get $shardUrls $id }}
{{- $_ = set $s2 "url" . }}
{{- end }}
{{- $shards = append $shards $s2 }}
{{- end }}
{{- range $id := keys $shardUrls }}
{{- if not (has $id $ids) }}
{{- fail (printf "secrets.shardUrls.%s: no shard with id %s in config.database.shards" $id $id) }}
{{- end }}
{{- end }}
{{- $_ = set $db "shards" $shards }}
{{- $_ = set $cfg "database" $db }}
{{- end -}}
# Notify configuration rendered by the Helm chart from values.yaml `config`
# (and secrets.shardUrls). Layering: built-in defaults, then this file
# (NOTIFY_CONFIG), then NOTIFY_SECTION__KEY environment variables.
{{- range $section := keys $cfg | sortAlpha }}
{{- $settings := get $cfg $section }}

[{{ include "notify.tomlKey" $section }}]
{{- range $key := keys $settings | sortAlpha }}
{{- $v := get $settings $key }}
{{- if not (kindIs "invalid" $v) }}
{{ include "notify.tomlKey" $key }} = {{ include "notify.tomlValue" $v }}
{{- end }}
{{- end }}
{{- end }}
{{ end }}

{{/*
Data of the chart-managed Secret (and of its hook copy): the config file
unless existingConfigSecret, the urls unless existingSecret.
*/}}
{{- define "notify.secretData" -}}
{{- if not .Values.secrets.existingConfigSecret }}
notify.toml: {{ include "notify.configToml" . | b64enc }}
{{- end }}
{{- if not .Values.secrets.existingSecret }}
{{- with .Values.secrets.databaseUrl }}
database-url: {{ . | b64enc }}
{{- end }}
{{- with .Values.secrets.rabbitmqUrl }}
rabbitmq-url: {{ . | b64enc }}
{{- end }}
{{- with .Values.secrets.redisUrl }}
redis-url: {{ . | b64enc }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod annotation that changes whenever the Secret's content does, so that
`helm upgrade` with new settings rolls the pods.
*/}}
{{- define "notify.checksumAnnotation" -}}
checksum/secret: {{ include "notify.secretData" . | sha256sum }}
{{- end }}

{{/*
Environment of every container: NOTIFY_CONFIG, the url variables and the
global extraEnv. Call with (dict "root" $ "secretName" "<chart secret name>").
*/}}
{{- define "notify.env" -}}
{{- $root := .root }}
{{- $secretName := .secretName }}
{{- $s := $root.Values.secrets }}
{{- $keys := $s.existingSecretKeys | default dict }}
- name: NOTIFY_CONFIG
  value: /etc/notify/notify.toml
{{- range $u := list (list "NOTIFY_DATABASE__URL" "databaseUrl" "database-url") (list "NOTIFY_RABBITMQ__URL" "rabbitmqUrl" "rabbitmq-url") (list "NOTIFY_REDIS__URL" "redisUrl" "redis-url") }}
{{- $var := index $u 0 }}
{{- $value := index $u 1 }}
{{- if $s.existingSecret }}
{{- with get $keys $value }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $s.existingSecret }}
      key: {{ . }}
{{- end }}
{{- else if get $s $value }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $secretName }}
      key: {{ index $u 2 }}
{{- end }}
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Volumes of every pod: the config file and a scratch /tmp (the root file
system is read-only). Call with (dict "root" $ "secretName" "<chart secret name>").
*/}}
{{- define "notify.volumes" -}}
- name: config
  secret:
    secretName: {{ .root.Values.secrets.existingConfigSecret | default .secretName }}
    defaultMode: 0444
    items:
      - key: notify.toml
        path: notify.toml
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{/*
Mounts matching notify.volumes.
*/}}
{{- define "notify.volumeMounts" -}}
- name: config
  mountPath: /etc/notify
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{/*
priorityClassName, nodeSelector, tolerations and affinity of a pod: the
component's own when non-empty, the global ones otherwise. Call with
(dict "root" $ "c" .Values.api).
*/}}
{{- define "notify.scheduling" -}}
{{- $root := .root }}
{{- $c := .c }}
{{- with ($c.priorityClassName | default $root.Values.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with ($c.nodeSelector | default $root.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.tolerations | default $root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($c.affinity | default $root.Values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
topologySpreadConstraints of a Deployment's pods: the component's own, or,
with defaultTopologySpread, a soft spread over zones, then nodes, of the
pods of the same rollout (matchLabelKeys pod-template-hash, beta and on by
default since 1.27, so old pods being replaced do not skew it). Call with
(dict "root" $ "c" .Values.api "component" "api").
*/}}
{{- define "notify.topologySpread" -}}
{{- $root := .root }}
{{- if .c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .c.topologySpreadConstraints | nindent 2 }}
{{- else if $root.Values.defaultTopologySpread }}
topologySpreadConstraints:
{{- range $key := list "topology.kubernetes.io/zone" "kubernetes.io/hostname" }}
  - maxSkew: 1
    topologyKey: {{ $key }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "notify.componentSelectorLabels" (list $root $.component) | nindent 8 }}
    matchLabelKeys:
      - pod-template-hash
{{- end }}
{{- end }}
{{- end }}

{{/*
Prometheus scrape annotations. Call with (dict "root" $ "port" 9464).
*/}}
{{- define "notify.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | toString | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}
