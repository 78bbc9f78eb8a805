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
Name of the kubernetes.io/tls Secret the api serves gRPC TLS from:
api.tls.secretName, or, when cert-manager issues it (api.tls.certManager),
<fullname>-api-tls. Fails when neither names one.
*/}}
{{- define "notify.apiTLSSecretName" -}}
{{- $tls := .Values.api.tls }}
{{- if $tls.secretName }}
{{- $tls.secretName }}
{{- else if ($tls.certManager | default dict).enabled }}
{{- printf "%s-api-tls" (include "notify.fullname" .) }}
{{- else }}
{{- fail "api.tls.enabled needs api.tls.secretName (a kubernetes.io/tls Secret with tls.crt and tls.key), or api.tls.certManager.enabled=true with api.tls.certManager.issuerRef to have cert-manager issue <fullname>-api-tls" }}
{{- end }}
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
The config file /etc/notify/notify.toml of the worker and the migration Job
(the api's adds [auth], see notify.apiConfigToml; the edge's [edge], see
notify.edgeConfigToml): .Values.config section by section but [edge], plus
what the chart derives from its own values, which it therefore refuses in
config: the listen addresses (listenHost and the ports), api.tls file paths
and client_auth (api.tls), the edge's keys (edge.tokens) and TLS files, url
files (secrets.urlsFrom=files, secrets.existingSecretKeys.shardUrls),
backend CA files (backendTLS), and the per-shard urls of secrets.shardUrls
merged into database.shards.
*/}}
{{- define "notify.configToml" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- range $section := keys $cfg }}
{{- if not (kindIs "map" (get $cfg $section)) }}
{{- fail (printf "config.%s must be a map of settings (a [%s] table)" $section $section) }}
{{- end }}
{{- end }}
{{- if hasKey $cfg "auth" }}
{{- fail "config.auth: callers are set in the chart's `auth` values (auth.enabled, auth.clients, ...), not in config" }}
{{- end }}
{{- $host := .Values.listenHost | default "0.0.0.0" }}
{{- $api := get $cfg "api" | default dict }}
{{- $_ := set $api "listen" (printf "%s:%d" $host (int .Values.api.ports.grpc)) }}
{{- $_ = set $api "metrics_listen" (printf "%s:%d" $host (int .Values.api.ports.metrics)) }}
{{- $tls := get $api "tls" | default dict }}
{{- range $key := list "cert_file" "key_file" "client_ca_file" "client_auth" }}
{{- if hasKey $tls $key }}
{{- fail (printf "config.api.tls.%s: set by the chart from api.tls (enabled, secretName, clientAuth, clientCA)" $key) }}
{{- end }}
{{- end }}
{{- with .Values.api.tls }}
{{- if .enabled }}
{{- $_ = include "notify.apiTLSSecretName" $ }}
{{- $_ = set $tls "cert_file" "/etc/notify-tls/server/tls.crt" }}
{{- $_ = set $tls "key_file" "/etc/notify-tls/server/tls.key" }}
{{- if not (has .clientAuth (list "none" "optional" "required")) }}
{{- fail (printf "api.tls.clientAuth: %q is not \"none\", \"optional\" or \"required\"" .clientAuth) }}
{{- end }}
{{- if ne .clientAuth "none" }}
{{- $_ = set $tls "client_auth" .clientAuth }}
{{- $_ = set $tls "client_ca_file" "/etc/notify-tls/client-ca/ca.crt" }}
{{- end }}
{{- $_ = set $api "tls" $tls }}
{{- else if ne .clientAuth "none" }}
{{- fail "api.tls.clientAuth needs api.tls.enabled" }}
{{- end }}
{{- end }}
{{- $_ = set $cfg "api" $api }}
{{- $console := get $cfg "console" | default dict }}
{{- range $key := list "enabled" "listen" }}
{{- if hasKey $console $key }}
{{- fail (printf "config.console.%s: set by the chart from api.console (enabled, port, expose)" $key) }}
{{- end }}
{{- end }}
{{- with .Values.api.console }}
{{- $_ = set $console "enabled" .enabled }}
{{- if and .expose .enabled }}
{{- if not $.Values.auth.enabled }}
{{- fail "api.console.expose needs auth.enabled: notify-api refuses to serve the console beyond loopback without authentication" }}
{{- end }}
{{- $_ = set $console "listen" (printf "%s:%d" $host (int .port)) }}
{{- else }}
{{- $_ = set $console "listen" (printf "127.0.0.1:%d" (int .port)) }}
{{- end }}
{{- if and .ingress.enabled (not .expose) }}
{{- fail "api.console.ingress.enabled needs api.console.expose" }}
{{- end }}
{{- if and .ingress.enabled (not .ingress.host) }}
{{- fail "api.console.ingress.host is required with api.console.ingress.enabled" }}
{{- end }}
{{- if and .ingress.enabled .ingress.tlsSecretName }}
{{- $_ = set $console "secure_cookie" true }}
{{- end }}
{{- end }}
{{- $_ = set $cfg "console" $console }}
{{- $worker := get $cfg "worker" | default dict }}
{{- $_ = set $worker "metrics_listen" (printf "%s:%d" $host (int .Values.worker.ports.metrics)) }}
{{- $_ = set $cfg "worker" $worker }}
{{- $edge := get $cfg "edge" | default dict }}
{{- range $key := list "listen" "metrics_listen" }}
{{- if hasKey $edge $key }}
{{- fail (printf "config.edge.%s: set by the chart from listenHost and edge.ports" $key) }}
{{- end }}
{{- end }}
{{- $edgeTokens := get $edge "tokens" | default dict }}
{{- range $key := list "keys" "jwks_file" }}
{{- if hasKey $edgeTokens $key }}
{{- fail (printf "config.edge.tokens.%s: set by the chart from edge.tokens (existingSecret, keys, jwks, jwksSecretKey)" $key) }}
{{- end }}
{{- end }}
{{- $edgeTLS := get $edge "tls" | default dict }}
{{- range $key := list "cert_file" "key_file" "client_ca_file" "client_auth" }}
{{- if hasKey $edgeTLS $key }}
{{- fail (printf "config.edge.tls.%s: the chart mounts no certificate for the edge; end TLS at its Ingress (edge.ingress.tlsSecretName)" $key) }}
{{- end }}
{{- end }}
{{- /* [edge] only in notify-edge.toml (notify.edgeConfigToml): no other process reads it, so an edge setting rolls only the edge. */}}
{{- $_ = unset $cfg "edge" }}
{{- $urlFiles := include "notify.urlFiles" . | fromJson }}
{{- range $section := list "database" "rabbitmq" "redis" }}
{{- $table := get $cfg $section | default dict }}
{{- range $key := list "url" "url_file" "tls_ca_file" }}
{{- if hasKey $table $key }}
{{- fail (printf "config.%s.%s: set by the chart (urls: secrets.*; url files: secrets.urlsFrom=files; CA files: backendTLS.%s)" $section $key $section) }}
{{- end }}
{{- end }}
{{- with get $urlFiles.main $section }}
{{- $_ := set $table "url_file" . }}
{{- end }}
{{- $ca := get $.Values.backendTLS $section | default dict }}
{{- if and $ca.secretName $ca.configMapName }}
{{- fail (printf "backendTLS.%s: set secretName or configMapName, not both" $section) }}
{{- end }}
{{- if or $ca.secretName $ca.configMapName }}
{{- $_ := set $table "tls_ca_file" (printf "/etc/notify-tls/%s/ca.crt" $section) }}
{{- end }}
{{- if $table }}
{{- $_ := set $cfg $section $table }}
{{- end }}
{{- end }}
{{- $inline := ternary dict (.Values.secrets.shardUrls | default dict) (eq .Values.secrets.urlsFrom "files") }}
{{- if or $inline $urlFiles.shards }}
{{- $db := get $cfg "database" | default dict }}
{{- if not (get $db "shards") }}
{{- fail "per-shard urls (secrets.shardUrls, secrets.existingSecretKeys.shardUrls) need the shard list in config.database.shards" }}
{{- end }}
{{- $ids := list }}
{{- $shards := list }}
{{- range $s := get $db "shards" }}
{{- $s2 := deepCopy $s }}
{{- if or (hasKey $s2 "url") (hasKey $s2 "url_file") }}
{{- fail (printf "config.database.shards (shard %v): urls hold passwords; set secrets.shardUrls or secrets.existingSecretKeys.shardUrls" $s.id) }}
{{- end }}
{{- $id := toString (int64 $s.id) }}
{{- $ids = append $ids $id }}
{{- with get $inline $id }}
{{- $_ = set $s2 "url" . }}
{{- end }}
{{- with get $urlFiles.shards $id }}
{{- $_ = set $s2 "url_file" . }}
{{- end }}
{{- $shards = append $shards $s2 }}
{{- end }}
{{- range $id := concat (keys (.Values.secrets.shardUrls | default dict)) (keys $urlFiles.shards) }}
{{- if not (has $id $ids) }}
{{- fail (printf "secrets.shardUrls.%s: no shard with id %s in config.database.shards" $id $id) }}
{{- end }}
{{- end }}
{{- $_ = set $db "shards" $shards }}
{{- $_ = set $cfg "database" $db }}
{{- end -}}
# Notify configuration rendered by the Helm chart from values.yaml `config`
# and the chart's own values (ports, TLS, url and CA files). Layering:
# built-in defaults, then this file (NOTIFY_CONFIG), then
# NOTIFY_SECTION__KEY environment variables.
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
The [auth] part of the api's config file, from the chart's `auth` values:
[[auth.clients]] tables with every field given in values. A client without
token_sha256 in values, when auth.existingSecret is set, gets the line
"#@token_sha256 <name> required|optional" instead, which the api pod's
auth-config init container replaces with the digests in that Secret's key
<name> (optional when the client also has cert_names).
*/}}
{{- define "notify.authToml" -}}
{{- $a := .Values.auth }}
{{- $host := .Values.listenHost | default "0.0.0.0" }}
{{- $loopback := or (hasPrefix "127." $host) (eq $host "[::1]") }}
{{- if and $a.enabled (not $a.clients) }}
{{- fail "auth.enabled is true but auth.clients is empty: add the callers (`notifyctl token new NAME --scopes ...` prints a token and its digest), or set auth.enabled=false with auth.insecureAllowUnauthenticated=true to run without authentication" }}
{{- end }}
{{- if and (not $a.enabled) (not $a.insecureAllowUnauthenticated) (not $loopback) }}
{{- fail (printf "auth.enabled is false: notify-api refuses to listen on %s without authentication; set auth.insecureAllowUnauthenticated=true to accept that anyone who reaches the api can make every call" $host) }}
{{- end }}
{{- $names := list }}
[auth]
enabled = {{ $a.enabled }}
{{- if $a.insecureAllowUnauthenticated }}
insecure_allow_unauthenticated = true
{{- end }}
{{- range $i, $c := $a.clients }}
{{- $where := printf "auth.clients[%d]" $i }}
{{- if not (kindIs "map" $c) }}
{{- fail (printf "%s: must be a map with name, scopes, token_sha256 or cert_names, ..." $where) }}
{{- end }}
{{- $name := toString ($c.name | default "") }}
{{- if not (regexMatch "^[a-z0-9_.-]{1,64}$" $name) }}
{{- fail (printf "%s.name: %q must be 1..64 of [a-z0-9_.-]" $where $name) }}
{{- end }}
{{- if has $name $names }}
{{- fail (printf "%s.name: client %q is defined twice" $where $name) }}
{{- end }}
{{- $names = append $names $name }}
{{- range $digest := $c.token_sha256 | default list }}
{{- if hasPrefix "ntf_" (toString $digest) }}
{{- fail (printf "%s.token_sha256 holds a token, not its digest: never put tokens in values; `echo -n TOKEN | notifyctl token hash` prints the digest" $where) }}
{{- end }}
{{- if not (regexMatch "^[0-9a-fA-F]{64}$" (toString $digest)) }}
{{- fail (printf "%s.token_sha256: a value is not a hex SHA-256 digest (64 hex digits; not shown, in case it is a secret)" $where) }}
{{- end }}
{{- end }}
{{- if and $c.cert_names (eq $.Values.api.tls.clientAuth "none") }}
{{- fail (printf "%s (%s).cert_names: client certificates need api.tls.clientAuth \"optional\" or \"required\"" $where $name) }}
{{- end }}
{{- if not (or $c.token_sha256 $c.cert_names $a.existingSecret) }}
{{- fail (printf "%s (%s): needs token_sha256 digests or cert_names, or auth.existingSecret with a key %q" $where $name $name) }}
{{- end }}

[[auth.clients]]
name = {{ toJson $name }}
{{- range $key := keys $c | sortAlpha }}
{{- $v := get $c $key }}
{{- if and (ne $key "name") (not (kindIs "invalid" $v)) }}
{{ include "notify.tomlKey" $key }} = {{ include "notify.tomlValue" $v }}
{{- end }}
{{- end }}
{{- if and $a.existingSecret (not $c.token_sha256) }}
#@token_sha256 {{ $name }} {{ if $c.cert_names }}optional{{ else }}required{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The api's config file: the shared one plus [auth]. The worker and the
migration Job read the shared file: they take no calls, so they need no
callers, and a client change rolls only the api.
*/}}
{{- define "notify.apiConfigToml" -}}
{{ include "notify.configToml" . }}
# Callers, from values.yaml `auth`.
{{ include "notify.authToml" . }}
{{ end }}

{{/*
The edge's token keys (edge.tokens), as JSON: "keys" the
[[edge.tokens.keys]] tables (kid, algorithm, secret_file or
public_key_file), "jwks_file" the JWKS path or "", "files" what the
ConfigMap <fullname>-edge-keys holds (inline public keys and JWKS, by file
name). Keys of edge.tokens.existingSecret are read from
/etc/notify-edge/secret/<key>, the ConfigMap's from /etc/notify-edge/public.
Fails on a key the edge would refuse, on a secret in values, and, unless
secrets.existingConfigSecret brings the edge's whole config file, when no
key is given: notify-edge refuses to start without one.
*/}}
{{- define "notify.edgeKeys" -}}
{{- $t := .Values.edge.tokens }}
{{- $secretDir := "/etc/notify-edge/secret" }}
{{- $publicDir := "/etc/notify-edge/public" }}
{{- $out := dict "keys" list "jwks_file" "" "files" dict }}
{{- $kids := list }}
{{- range $i, $k := $t.keys | default list }}
{{- $where := printf "edge.tokens.keys[%d]" $i }}
{{- if not (kindIs "map" $k) }}
{{- fail (printf "%s: must be a map with kid, algorithm and secretKey or publicKey" $where) }}
{{- end }}
{{- $kid := toString ($k.kid | default "") }}
{{- if has $kid $kids }}
{{- fail (printf "%s: kid %q is defined twice" $where $kid) }}
{{- end }}
{{- $kids = append $kids $kid }}
{{- $alg := toString ($k.algorithm | default "") }}
{{- if not (has $alg (list "HS256" "RS256" "ES256" "EdDSA")) }}
{{- fail (printf "%s.algorithm: %q is not HS256, RS256, ES256 or EdDSA" $where $alg) }}
{{- end }}
{{- $field := ternary "secret_file" "public_key_file" (eq $alg "HS256") }}
{{- $key := dict "kid" $kid "algorithm" $alg }}
{{- if and $k.secretKey $k.publicKey }}
{{- fail (printf "%s: set secretKey or publicKey, not both" $where) }}
{{- else if $k.secretKey }}
{{- if not $t.existingSecret }}
{{- fail (printf "%s.secretKey needs edge.tokens.existingSecret, the Secret holding the key %q" $where $k.secretKey) }}
{{- end }}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString $k.secretKey)) }}
{{- fail (printf "%s.secretKey: %q is not a Secret key ([-._a-zA-Z0-9]+)" $where $k.secretKey) }}
{{- end }}
{{- $_ := set $key $field (printf "%s/%s" $secretDir $k.secretKey) }}
{{- else if $k.publicKey }}
{{- if eq $alg "HS256" }}
{{- fail (printf "%s: an HS256 key is a shared secret and never goes into values: put it in a key of edge.tokens.existingSecret and name that key in secretKey" $where) }}
{{- end }}
{{- if contains "PRIVATE KEY" $k.publicKey }}
{{- fail (printf "%s.publicKey holds a private key: the edge needs the public key only (openssl pkey -in KEY -pubout); keep the private key with the app's backend" $where) }}
{{- end }}
{{- if not (contains "-----BEGIN" $k.publicKey) }}
{{- fail (printf "%s.publicKey: not a PEM public key (-----BEGIN PUBLIC KEY-----)" $where) }}
{{- end }}
{{- $file := ternary (printf "kid-%s.pem" $kid) (printf "key-%d.pem" $i) (regexMatch "^[-._a-zA-Z0-9]{1,200}$" $kid) }}
{{- $_ := set $out.files $file $k.publicKey }}
{{- $_ := set $key $field (printf "%s/%s" $publicDir $file) }}
{{- else }}
{{- fail (printf "%s (kid %q): needs secretKey (a key of edge.tokens.existingSecret) or publicKey (an inline PEM public key; not for HS256)" $where $kid) }}
{{- end }}
{{- $_ := set $out "keys" (append $out.keys $key) }}
{{- end }}
{{- if and $t.jwks $t.jwksSecretKey }}
{{- fail "edge.tokens: set jwks or jwksSecretKey, not both (the edge reads one JWKS file)" }}
{{- end }}
{{- if $t.jwks }}
{{- if not (kindIs "slice" (get $t.jwks "keys")) }}
{{- fail "edge.tokens.jwks: not a JSON Web Key Set ({ keys: [...] })" }}
{{- end }}
{{- range $jwk := get $t.jwks "keys" }}
{{- if and (kindIs "map" $jwk) (hasKey $jwk "d") }}
{{- fail "edge.tokens.jwks holds a private key (a JWK with d): publish the public keys only" }}
{{- end }}
{{- if and (kindIs "map" $jwk) (or (hasKey $jwk "k") (eq (toString (get $jwk "kty")) "oct")) }}
{{- fail "edge.tokens.jwks holds an HS256 secret (a JWK of kty oct): a shared secret never goes into values; keep that JWKS in edge.tokens.existingSecret (jwksSecretKey)" }}
{{- end }}
{{- end }}
{{- $_ := set $out.files "jwks.json" (toPrettyJson $t.jwks) }}
{{- $_ := set $out "jwks_file" (printf "%s/jwks.json" $publicDir) }}
{{- else if $t.jwksSecretKey }}
{{- if not $t.existingSecret }}
{{- fail "edge.tokens.jwksSecretKey needs edge.tokens.existingSecret, the Secret holding the JWKS" }}
{{- end }}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString $t.jwksSecretKey)) }}
{{- fail (printf "edge.tokens.jwksSecretKey: %q is not a Secret key ([-._a-zA-Z0-9]+)" $t.jwksSecretKey) }}
{{- end }}
{{- $_ := set $out "jwks_file" (printf "%s/%s" $secretDir $t.jwksSecretKey) }}
{{- end }}
{{- if and .Values.edge.enabled (not $out.keys) (not $out.jwks_file) (not .Values.secrets.existingConfigSecret) }}
{{- fail "edge.enabled is true but edge.tokens names no key: notify-edge refuses to start without one. Set edge.tokens.keys (each with kid, algorithm and secretKey, a key of edge.tokens.existingSecret, or publicKey, an inline PEM public key), or a JWKS (edge.tokens.jwks, or edge.tokens.jwksSecretKey with edge.tokens.existingSecret), or edge.enabled=false" }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The edge's config file: the shared one plus [edge], from config.edge and
what the chart derives: the listen addresses (listenHost, edge.ports) and
the token keys (notify.edgeKeys). Only the edge reads [edge].
*/}}
{{- define "notify.edgeConfigToml" -}}
{{- $host := .Values.listenHost | default "0.0.0.0" }}
{{- $edge := deepCopy (get (.Values.config | default dict) "edge" | default dict) }}
{{- $_ := set $edge "listen" (printf "%s:%d" $host (int .Values.edge.ports.http)) }}
{{- $_ = set $edge "metrics_listen" (printf "%s:%d" $host (int .Values.edge.ports.metrics)) }}
{{- $tokens := get $edge "tokens" | default dict }}
{{- $_ = unset $edge "tokens" }}
{{- $keys := include "notify.edgeKeys" . | fromJson }}
{{- with $keys.jwks_file }}
{{- $_ = set $tokens "jwks_file" . }}
{{- end }}
{{ include "notify.configToml" . }}
# notify-edge, from values.yaml `edge` and config.edge.
[edge]
{{- range $key := keys $edge | sortAlpha }}
{{- $v := get $edge $key }}
{{- if not (kindIs "invalid" $v) }}
{{ include "notify.tomlKey" $key }} = {{ include "notify.tomlValue" $v }}
{{- end }}
{{- end }}

[edge.tokens]
{{- range $key := keys $tokens | sortAlpha }}
{{- $v := get $tokens $key }}
{{- if not (kindIs "invalid" $v) }}
{{ include "notify.tomlKey" $key }} = {{ include "notify.tomlValue" $v }}
{{- end }}
{{- end }}
{{- range $k := $keys.keys }}

[[edge.tokens.keys]]
{{- range $key := keys $k | sortAlpha }}
{{ include "notify.tomlKey" $key }} = {{ include "notify.tomlValue" (get $k $key) }}
{{- end }}
{{- end }}
{{ end }}

{{/*
Which backend urls the processes read from files (secrets.urlsFrom=files,
or per-shard keys of existingSecret), as JSON: "main" maps database,
rabbitmq and redis to their file, "shards" shard ids to theirs; "chart" and
"existing" list the {key, path} items that the urls volume projects from the
chart's Secret and from existingSecret. Every file is /etc/notify-urls/<path>.
*/}}
{{- define "notify.urlFiles" -}}
{{- $s := .Values.secrets }}
{{- if not (has $s.urlsFrom (list "env" "files")) }}
{{- fail (printf "secrets.urlsFrom: %q is neither \"env\" nor \"files\"" $s.urlsFrom) }}
{{- end }}
{{- $files := eq $s.urlsFrom "files" }}
{{- $keys := $s.existingSecretKeys | default dict }}
{{- $out := dict "main" dict "shards" dict "chart" list "existing" list }}
{{- range $u := list (list "database" "databaseUrl" "database-url") (list "rabbitmq" "rabbitmqUrl" "rabbitmq-url") (list "redis" "redisUrl" "redis-url") }}
{{- $section := index $u 0 }}
{{- $path := index $u 2 }}
{{- if $files }}
{{- if $s.existingSecret }}
{{- with get $keys (index $u 1) }}
{{- $_ := set $out "existing" (append $out.existing (dict "key" . "path" $path)) }}
{{- $_ := set $out.main $section (printf "/etc/notify-urls/%s" $path) }}
{{- end }}
{{- else if get $s (index $u 1) }}
{{- $_ := set $out "chart" (append $out.chart (dict "key" $path "path" $path)) }}
{{- $_ := set $out.main $section (printf "/etc/notify-urls/%s" $path) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $files }}
{{- range $id, $url := $s.shardUrls | default dict }}
{{- $path := printf "shard-%s-url" $id }}
{{- $_ := set $out "chart" (append $out.chart (dict "key" $path "path" $path)) }}
{{- $_ := set $out.shards $id (printf "/etc/notify-urls/%s" $path) }}
{{- end }}
{{- end }}
{{- range $id, $key := $keys.shardUrls | default dict }}
{{- if not $s.existingSecret }}
{{- fail "secrets.existingSecretKeys.shardUrls needs secrets.existingSecret" }}
{{- end }}
{{- if hasKey ($s.shardUrls | default dict) $id }}
{{- fail (printf "shard %s has a url in both secrets.shardUrls and secrets.existingSecretKeys.shardUrls" $id) }}
{{- end }}
{{- $path := printf "shard-%s-url" $id }}
{{- $_ := set $out "existing" (append $out.existing (dict "key" $key "path" $path)) }}
{{- $_ := set $out.shards $id (printf "/etc/notify-urls/%s" $path) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The url keys of the chart-managed Secret: the three urls (none with
existingSecret) and, with urlsFrom=files, one key per shard url.
*/}}
{{- define "notify.urlData" -}}
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
{{- if eq .Values.secrets.urlsFrom "files" }}
{{- range $id, $url := .Values.secrets.shardUrls | default dict }}
shard-{{ $id }}-url: {{ $url | b64enc }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Data of the chart-managed Secret, or of its hook copy for the migration Job
(which gets no api or edge config file). The config files unless
existingConfigSecret, the urls unless existingSecret. Call with
(dict "root" $ "api" true|false).
*/}}
{{- define "notify.secretData" -}}
{{- $root := .root }}
{{- if not $root.Values.secrets.existingConfigSecret }}
notify.toml: {{ include "notify.configToml" $root | b64enc }}
{{- if .api }}
notify-api.toml: {{ include "notify.apiConfigToml" $root | b64enc }}
{{- if $root.Values.edge.enabled }}
notify-edge.toml: {{ include "notify.edgeConfigToml" $root | b64enc }}
{{- end }}
{{- end }}
{{- end }}
{{- include "notify.urlData" $root }}
{{- end }}

{{/*
Pod annotation that changes whenever what the pod reads from the chart's
Secret does, so that `helm upgrade` with new settings rolls the pods (a
client change rolls only the api, and the worker too once clients have
webhooks; an edge setting or a change of edge.tokens' list only the edge).
The contents of the edge's key files are not in it: the edge re-reads them
(edge.tokens.reload_interval_secs), so a new key rolls nothing.
Call with (dict "root" $ "component" "api").
*/}}
{{- define "notify.checksumAnnotation" -}}
{{- $root := .root }}
{{- $config := "" }}
{{- if not $root.Values.secrets.existingConfigSecret }}
{{- if eq .component "edge" }}
{{- $config = include "notify.edgeConfigToml" $root }}
{{- else if include "notify.readsAuth" . }}
{{- $config = include "notify.apiConfigToml" $root }}
{{- else }}
{{- $config = include "notify.configToml" $root }}
{{- end }}
{{- end }}
checksum/secret: {{ printf "%s\n%s" $config (include "notify.urlData" $root) | sha256sum }}
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
{{- $urls := ternary list (list (list "NOTIFY_DATABASE__URL" "databaseUrl" "database-url") (list "NOTIFY_RABBITMQ__URL" "rabbitmqUrl" "rabbitmq-url") (list "NOTIFY_REDIS__URL" "redisUrl" "redis-url")) (eq $s.urlsFrom "files") }}
{{- range $u := $urls }}
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
Volumes of a pod: the config file (for the api with auth.existingSecret, a
template of it plus the digests, joined by the auth-config init container
into an emptyDir), a scratch /tmp (the root file system is read-only), url
files, backend CAs, the api's TLS files and the edge's key files.
Call with (dict "root" $ "component" "api|worker|edge|migration" "secretName" "<chart secret>").
*/}}
{{- define "notify.volumes" -}}
{{- $root := .root }}
{{- $s := $root.Values.secrets }}
{{- $key := "notify.toml" }}
{{- if not $s.existingConfigSecret }}
{{- if eq .component "edge" }}
{{- $key = "notify-edge.toml" }}
{{- else if include "notify.readsAuth" (dict "root" $root "component" .component) }}
{{- $key = "notify-api.toml" }}
{{- end }}
{{- end }}
{{- if include "notify.authConfigInit" (dict "root" $root "component" .component) }}
- name: config-template
  secret:
    secretName: {{ .secretName }}
    defaultMode: 0444
    items:
      - key: {{ $key }}
        path: notify.toml
- name: config
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
- name: auth-digests
  secret:
    secretName: {{ $root.Values.auth.existingSecret }}
    defaultMode: 0440
{{- else }}
- name: config
  secret:
    secretName: {{ $s.existingConfigSecret | default .secretName }}
    defaultMode: 0444
    items:
      - key: {{ $key }}
        path: notify.toml
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- $urlFiles := include "notify.urlFiles" $root | fromJson }}
{{- if or $urlFiles.chart $urlFiles.existing }}
- name: urls
  projected:
    defaultMode: 0440
    sources:
      {{- with $urlFiles.chart }}
      - secret:
          name: {{ $.secretName }}
          items:
            {{- toYaml . | nindent 12 }}
      {{- end }}
      {{- with $urlFiles.existing }}
      - secret:
          name: {{ $s.existingSecret }}
          items:
            {{- toYaml . | nindent 12 }}
      {{- end }}
{{- end }}
{{- range $backend := list "database" "rabbitmq" "redis" }}
{{- $ca := get $root.Values.backendTLS $backend }}
{{- if $ca.secretName }}
- name: {{ $backend }}-ca
  secret:
    secretName: {{ $ca.secretName }}
    defaultMode: 0444
    items:
      - key: {{ $ca.key | default "ca.crt" }}
        path: ca.crt
{{- else if $ca.configMapName }}
- name: {{ $backend }}-ca
  configMap:
    name: {{ $ca.configMapName }}
    defaultMode: 0444
    items:
      - key: {{ $ca.key | default "ca.crt" }}
        path: ca.crt
{{- end }}
{{- end }}
{{- if eq .component "edge" }}
{{- /* Whole directories (no subPath), so that a changed key reaches the pod. */}}
{{- with $root.Values.edge.tokens.existingSecret }}
- name: edge-secret-keys
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end }}
{{- if (include "notify.edgeKeys" $root | fromJson).files }}
- name: edge-public-keys
  configMap:
    name: {{ include "notify.fullname" $root }}-edge-keys
    defaultMode: 0444
{{- end }}
{{- end }}
{{- $tls := $root.Values.api.tls }}
{{- if and (eq .component "api") $tls.enabled }}
{{- /* Whole-Secret directories (no subPath), so that renewals reach the pod. */}}
- name: tls
  secret:
    secretName: {{ include "notify.apiTLSSecretName" $root }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- if ne $tls.clientAuth "none" }}
- name: client-ca
  secret:
    secretName: {{ $tls.clientCA.secretName | default (include "notify.apiTLSSecretName" $root) }}
    defaultMode: 0444
    items:
      - key: {{ $tls.clientCA.key | default "ca.crt" }}
        path: ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/*
Mounts matching notify.volumes. Call with (dict "root" $ "component" "api").
*/}}
{{- define "notify.volumeMounts" -}}
- name: config
  mountPath: /etc/notify
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- $urlFiles := include "notify.urlFiles" .root | fromJson }}
{{- if or $urlFiles.chart $urlFiles.existing }}
- name: urls
  mountPath: /etc/notify-urls
  readOnly: true
{{- end }}
{{- range $backend := list "database" "rabbitmq" "redis" }}
{{- $ca := get $.root.Values.backendTLS $backend }}
{{- if or $ca.secretName $ca.configMapName }}
- name: {{ $backend }}-ca
  mountPath: /etc/notify-tls/{{ $backend }}
  readOnly: true
{{- end }}
{{- end }}
{{- if eq .component "edge" }}
{{- if .root.Values.edge.tokens.existingSecret }}
- name: edge-secret-keys
  mountPath: /etc/notify-edge/secret
  readOnly: true
{{- end }}
{{- if (include "notify.edgeKeys" .root | fromJson).files }}
- name: edge-public-keys
  mountPath: /etc/notify-edge/public
  readOnly: true
{{- end }}
{{- end }}
{{- $tls := .root.Values.api.tls }}
{{- if and (eq .component "api") $tls.enabled }}
- name: tls
  mountPath: /etc/notify-tls/server
  readOnly: true
{{- if ne $tls.clientAuth "none" }}
- name: client-ca
  mountPath: /etc/notify-tls/client-ca
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when the pod joins its config file from the chart's template and the
digests of auth.existingSecret (the api, unless existingConfigSecret).
Call with (dict "root" $ "component" "api").
*/}}
{{- define "notify.authConfigInit" -}}
{{- if and (include "notify.readsAuth" .) .root.Values.auth.existingSecret (not .root.Values.secrets.existingConfigSecret) }}true{{ end }}
{{- end }}

{{/*
"true" when the component reads the api's config file, [auth] included: the
api, and the worker once a client has webhooks (the worker calls them; see
docs/webhooks.md); never the edge or the migration Jobs, whose Secrets have
no such file. Call with (dict "root" $ "component" "worker").
*/}}
{{- define "notify.readsAuth" -}}
{{- $hooks := false }}
{{- range $c := .root.Values.auth.clients | default list }}
{{- if and (kindIs "map" $c) $c.webhooks }}{{ $hooks = true }}{{ end }}
{{- end }}
{{- if or (eq .component "api") (and $hooks (eq .component "worker")) }}true{{ end }}
{{- end }}

{{/*
The auth-config init container of the api: copies the config template,
replacing each "#@token_sha256 NAME required|optional" line with the digests
in file NAME of auth.existingSecret (hex digits separated by blanks, commas or
newlines). A required key that is missing, or a value that is not hex, stops
the pod with a line saying which.
*/}}
{{- define "notify.authConfigInitContainer" -}}
{{- $root := . }}
- name: auth-config
  image: {{ include "notify.image" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command:
    - sh
    - -ec
    - |
      out=/etc/notify/notify.toml
      : >"$out.tmp"
      while IFS= read -r line || [ -n "$line" ]; do
        case $line in
        '#@token_sha256 '*)
          set -- ${line#'#@token_sha256 '}
          file=/etc/notify-auth/$1
          if [ ! -f "$file" ]; then
            if [ "$2" = required ]; then
              echo "auth.existingSecret {{ $root.Values.auth.existingSecret }} has no key $1 (the token digests of client $1)" >&2
              exit 1
            fi
            continue
          fi
          list=
          for digest in $(tr ',' ' ' <"$file"); do
            case $digest in
            *[!0-9a-fA-F]*)
              echo "auth.existingSecret {{ $root.Values.auth.existingSecret }}, key $1: not a hex digest (notifyctl token hash prints one)" >&2
              exit 1
              ;;
            esac
            list="$list${list:+, }\"$digest\""
          done
          printf 'token_sha256 = [%s]\n' "$list" >>"$out.tmp"
          ;;
        *) printf '%s\n' "$line" >>"$out.tmp" ;;
        esac
      done </etc/notify-template/notify.toml
      mv "$out.tmp" "$out"
  resources:
    requests:
      cpu: 10m
      memory: 16Mi
    limits:
      memory: 32Mi
  {{- with $root.Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: config-template
      mountPath: /etc/notify-template
      readOnly: true
    - name: auth-digests
      mountPath: /etc/notify-auth
      readOnly: true
    - name: config
      mountPath: /etc/notify
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
