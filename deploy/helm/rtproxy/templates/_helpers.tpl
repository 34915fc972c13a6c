{{/*
Every helper here takes a context with .Values (this chart's values) and
.Release, and never reads .Chart: the sidecar templates are rendered by an
application chart, where .Chart is the application's and .Values holds this
chart's values under the dependency's key ("rtproxy").

Numbers from values files arrive as float64, so every number is passed
through int64 before printing (otherwise 104857600 prints as 1.048576e+08).
*/}}

{{- define "rtproxy.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "rtproxy" .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rtproxy.configMapName" -}}
{{- printf "%s-config" (include "rtproxy.fullname" .) -}}
{{- end -}}

{{- define "rtproxy.rulesConfigMapName" -}}
{{- if .Values.rules.existingConfigMap -}}
{{- .Values.rules.existingConfigMap -}}
{{- else -}}
{{- printf "%s-rules" (include "rtproxy.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "rtproxy.stateClaimName" -}}
{{- if .Values.state.persistentVolumeClaim.existingClaim -}}
{{- .Values.state.persistentVolumeClaim.existingClaim -}}
{{- else -}}
{{- printf "%s-state" (include "rtproxy.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "rtproxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rtproxy.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rtproxy.selectorLabels" -}}
app.kubernetes.io/name: {{ default "rtproxy" .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "rtproxy.labels" -}}
{{ include "rtproxy.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rtproxy
{{- end -}}

{{/* Paths inside the container; the Dockerfile uses the same ones and
deploy/scripts/image-check.sh compares them. */}}
{{- define "rtproxy.configDir" -}}/etc/rtproxy{{- end -}}
{{- define "rtproxy.configPath" -}}/etc/rtproxy/rtproxy.yaml{{- end -}}
{{- define "rtproxy.rulesDir" -}}/etc/rtproxy/rules{{- end -}}
{{- define "rtproxy.stateDir" -}}/var/lib/rtproxy{{- end -}}
{{- define "rtproxy.clientTLSDir" -}}/etc/rtproxy/tls/client{{- end -}}
{{- define "rtproxy.upstreamTLSDir" -}}/etc/rtproxy/tls/upstream{{- end -}}
{{- define "rtproxy.registryAuthDir" -}}/etc/rtproxy/schema-registry/auth{{- end -}}
{{- define "rtproxy.registryCADir" -}}/etc/rtproxy/schema-registry/ca{{- end -}}

{{/* rtproxy.registryAuthKey is the key of schemaRegistry.auth's Secret. */}}
{{- define "rtproxy.registryAuthKey" -}}
{{- $a := .Values.schemaRegistry.auth -}}
{{- if $a.secretKey -}}{{- $a.secretKey -}}{{- else if eq $a.type "bearer" -}}token{{- else -}}credentials{{- end -}}
{{- end -}}

{{/* rtproxy.registryAuth is true when a registry credentials Secret is mounted. */}}
{{- define "rtproxy.registryAuth" -}}
{{- with .Values.schemaRegistry -}}{{- if and .url (ne (.auth.type | default "none") "none") -}}true{{- end -}}{{- end -}}
{{- end -}}

{{/* rtproxy.registryCA is true when a registry CA Secret is mounted. */}}
{{- define "rtproxy.registryCA" -}}
{{- with .Values.schemaRegistry -}}{{- if and .url .caSecretName -}}true{{- end -}}{{- end -}}
{{- end -}}

{{- define "rtproxy.listenHost" -}}
{{- if eq .Values.mode "sidecar" -}}127.0.0.1{{- else -}}0.0.0.0{{- end -}}
{{- end -}}

{{- define "rtproxy.advertiseHost" -}}
{{- if .Values.proxy.advertiseHost -}}
{{- .Values.proxy.advertiseHost -}}
{{- else if eq .Values.mode "sidecar" -}}
127.0.0.1
{{- else -}}
{{- printf "%s.%s.svc" (include "rtproxy.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* rtproxy.config is the content of rtproxy.yaml (keys: config/ package). */}}
{{- define "rtproxy.config" -}}
{{- $p := .Values.proxy -}}
listen: {{ printf "%s:%d" (include "rtproxy.listenHost" .) ($p.listenPort | int64) | quote }}
advertise_host: {{ include "rtproxy.advertiseHost" . | quote }}
broker_ports: {{ $p.brokerPorts | int64 }}
broker_port_count: {{ $p.brokerPortCount | int64 }}
{{- if $p.upstream }}
upstream:
{{- range $p.upstream }}
  - {{ . | quote }}
{{- end }}
{{- else }}
upstream: []
{{- end }}
rules_dir: {{ include "rtproxy.rulesDir" . }}
state_dir: {{ include "rtproxy.stateDir" . }}
admin_listen: {{ printf "0.0.0.0:%d" ($p.adminPort | int64) | quote }}
log_level: {{ $p.logLevel }}
log_format: {{ $p.logFormat }}
max_frame_bytes: {{ $p.maxFrameBytes | int64 }}
shutdown_grace: {{ $p.shutdownGrace }}
batch_window: {{ $p.batchWindow | default "0" | quote }}
{{- if $p.pprof }}
pprof: true
{{- end }}
{{- with (.Values.rules.allow | default dict) }}
{{- if or .env .files .urls }}
rules:
  allow:
    env: {{ .env | default list | toJson }}
    files: {{ .files | default list | toJson }}
    urls: {{ .urls | default list | toJson }}
{{- end }}
{{- end }}
{{- if or .Values.tls.client.enabled .Values.tls.upstream.enabled }}
tls:
{{- with .Values.tls.client }}
{{- if .enabled }}
  client:
    cert_file: {{ include "rtproxy.clientTLSDir" $ }}/tls.crt
    key_file: {{ include "rtproxy.clientTLSDir" $ }}/tls.key
{{- if .requireClientCert }}
    client_ca_file: {{ include "rtproxy.clientTLSDir" $ }}/ca.crt
{{- end }}
    require_client_cert: {{ .requireClientCert }}
{{- end }}
{{- end }}
{{- with .Values.tls.upstream }}
{{- if .enabled }}
  upstream:
    enabled: true
    ca_file: {{ include "rtproxy.upstreamTLSDir" $ }}/ca.crt
{{- if .mutual }}
    cert_file: {{ include "rtproxy.upstreamTLSDir" $ }}/tls.crt
    key_file: {{ include "rtproxy.upstreamTLSDir" $ }}/tls.key
{{- if .forwardIdentity }}
    forward_identity: true
{{- end }}
{{- end }}
{{- if .serverName }}
    server_name: {{ .serverName | quote }}
{{- end }}
    insecure_skip_verify: {{ .insecureSkipVerify }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.sasl.enabled }}
sasl:
  mechanism: {{ .Values.sasl.mechanism }}
  username: {{ .Values.sasl.username | quote }}
  # password: from the RTPROXY_SASL_PASSWORD environment variable (Secret {{ .Values.sasl.passwordSecret.name }})
{{- end }}
{{- with .Values.schemaRegistry }}
{{- if .url }}
schema_registry:
  url: {{ .url | quote }}
{{- if eq (.auth.type | default "none") "basic" }}
  # user:password from Secret {{ .auth.secretName }}
  basic_auth_file: {{ include "rtproxy.registryAuthDir" $ }}/{{ include "rtproxy.registryAuthKey" $ }}
{{- else if eq (.auth.type | default "none") "bearer" }}
  # the token from Secret {{ .auth.secretName }}
  bearer_token_file: {{ include "rtproxy.registryAuthDir" $ }}/{{ include "rtproxy.registryAuthKey" $ }}
{{- end }}
{{- if .caSecretName }}
  ca_file: {{ include "rtproxy.registryCADir" $ }}/ca.crt
{{- end }}
{{- if .timeout }}
  timeout: {{ .timeout }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* rtproxy.configChecksum changes whenever rtproxy.yaml does. The config is
read once at start, so pods carry it as an annotation to roll on change.
Rules are not part of it: they reload hot. */}}
{{- define "rtproxy.configChecksum" -}}
{{- include "rtproxy.config" . | sha256sum -}}
{{- end -}}

{{/* rtproxy.validate fails rendering on combinations a schema can't express. */}}
{{- define "rtproxy.validate" -}}
{{- if and .Values.tls.client.enabled (not .Values.tls.client.secretName) -}}
{{- fail "tls.client.enabled needs tls.client.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- if and .Values.tls.upstream.enabled (not .Values.tls.upstream.secretName) -}}
{{- fail "tls.upstream.enabled needs tls.upstream.secretName (a Secret with ca.crt, and tls.crt/tls.key when mutual)" -}}
{{- end -}}
{{- if and .Values.sasl.enabled (or (not .Values.sasl.username) (not .Values.sasl.passwordSecret.name)) -}}
{{- fail "sasl.enabled needs sasl.username and sasl.passwordSecret.name" -}}
{{- end -}}
{{- if and (not .Values.proxy.upstream) (or .Values.tls.upstream.enabled .Values.sasl.enabled) -}}
{{- fail "tls.upstream and sasl need proxy.upstream: with no upstream the proxy runs its embedded development brokers, which speak plaintext without SASL" -}}
{{- end -}}
{{- with .Values.schemaRegistry -}}
{{- $auth := .auth.type | default "none" -}}
{{- if and (ne $auth "none") (not .url) -}}
{{- fail "schemaRegistry.auth needs schemaRegistry.url" -}}
{{- end -}}
{{- if and .caSecretName (not .url) -}}
{{- fail "schemaRegistry.caSecretName needs schemaRegistry.url" -}}
{{- end -}}
{{- if and (ne $auth "none") (not .auth.secretName) -}}
{{- fail (printf "schemaRegistry.auth.type %s needs schemaRegistry.auth.secretName (a Secret holding the %s)" $auth (ternary "token" "user:password" (eq $auth "bearer"))) -}}
{{- end -}}
{{- if and .url (not (regexMatch "^https?://" .url)) -}}
{{- fail (printf "schemaRegistry.url %q must start with http:// or https://" .url) -}}
{{- end -}}
{{- if and .url (regexMatch "^https?://[^/]*@" .url) -}}
{{- fail "schemaRegistry.url holds credentials; put them in a Secret named by schemaRegistry.auth" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.rules.files .Values.rules.existingConfigMap -}}
{{- fail "set either rules.files or rules.existingConfigMap, not both" -}}
{{- end -}}
{{- $p := .Values.proxy -}}
{{- $first := $p.brokerPorts | int64 -}}
{{- $last := add $first ($p.brokerPortCount | int64) -1 -}}
{{- if gt $last 65535 -}}
{{- fail (printf "proxy.brokerPorts + proxy.brokerPortCount - 1 = %d is above 65535" $last) -}}
{{- end -}}
{{- range $name, $port := dict "listenPort" $p.listenPort "adminPort" $p.adminPort -}}
{{- if and (ge ($port | int64) $first) (le ($port | int64) $last) -}}
{{- fail (printf "proxy.%s %d falls inside the per-broker range %d-%d" $name ($port | int64) $first $last) -}}
{{- end -}}
{{- end -}}
{{- if eq ($p.listenPort | int64) ($p.adminPort | int64) -}}
{{- fail "proxy.listenPort and proxy.adminPort must differ" -}}
{{- end -}}
{{- end -}}

{{/* rtproxy.container is one list item for a pod's containers. */}}
{{- define "rtproxy.container" -}}
{{- include "rtproxy.validate" . -}}
{{- $p := .Values.proxy -}}
- name: rtproxy
  image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - run
    - --config
    - {{ include "rtproxy.configPath" . }}
  {{- if or .Values.sasl.enabled .Values.extraEnv }}
  env:
    {{- if .Values.sasl.enabled }}
    - name: RTPROXY_SASL_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ .Values.sasl.passwordSecret.name }}
          key: {{ .Values.sasl.passwordSecret.key }}
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  ports:
    - name: bootstrap
      containerPort: {{ $p.listenPort | int64 }}
      protocol: TCP
    {{- $first := $p.brokerPorts | int64 }}
    {{- range $i := until ($p.brokerPortCount | int) }}
    - name: {{ printf "broker-%d" $i }}
      containerPort: {{ add $first $i }}
      protocol: TCP
    {{- end }}
    - name: admin
      containerPort: {{ $p.adminPort | int64 }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    {{- toYaml .Values.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    {{- toYaml .Values.readinessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: rtproxy-config
      mountPath: {{ include "rtproxy.configPath" . }}
      # subPath is fine here: the config is read once at start and a change
      # rolls the pod (checksum annotation). Never for the rules below.
      subPath: rtproxy.yaml
      readOnly: true
    - name: rtproxy-rules
      mountPath: {{ include "rtproxy.rulesDir" . }}
      readOnly: true
    - name: rtproxy-state
      mountPath: {{ include "rtproxy.stateDir" . }}
    - name: rtproxy-tmp
      mountPath: /tmp
    {{- if .Values.tls.client.enabled }}
    - name: rtproxy-tls-client
      mountPath: {{ include "rtproxy.clientTLSDir" . }}
      readOnly: true
    {{- end }}
    {{- if .Values.tls.upstream.enabled }}
    - name: rtproxy-tls-upstream
      mountPath: {{ include "rtproxy.upstreamTLSDir" . }}
      readOnly: true
    {{- end }}
    {{- if include "rtproxy.registryAuth" . }}
    - name: rtproxy-registry-auth
      mountPath: {{ include "rtproxy.registryAuthDir" . }}
      readOnly: true
    {{- end }}
    {{- if include "rtproxy.registryCA" . }}
    - name: rtproxy-registry-ca
      mountPath: {{ include "rtproxy.registryCADir" . }}
      readOnly: true
    {{- end }}
{{- end -}}

{{/* rtproxy.volumes is the list items the container above mounts. */}}
{{- define "rtproxy.volumes" -}}
- name: rtproxy-config
  configMap:
    name: {{ include "rtproxy.configMapName" . }}
- name: rtproxy-rules
  configMap:
    name: {{ include "rtproxy.rulesConfigMapName" . }}
- name: rtproxy-state
  {{- if eq .Values.state.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ include "rtproxy.stateClaimName" . }}
  {{- else }}
  emptyDir:
    {{- with .Values.state.emptyDir.sizeLimit }}
    sizeLimit: {{ . }}
    {{- end }}
  {{- end }}
- name: rtproxy-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.tls.client.enabled }}
- name: rtproxy-tls-client
  secret:
    secretName: {{ .Values.tls.client.secretName }}
{{- end }}
{{- if .Values.tls.upstream.enabled }}
- name: rtproxy-tls-upstream
  secret:
    secretName: {{ .Values.tls.upstream.secretName }}
{{- end }}
{{- if include "rtproxy.registryAuth" . }}
- name: rtproxy-registry-auth
  secret:
    secretName: {{ .Values.schemaRegistry.auth.secretName }}
    items:
      - key: {{ include "rtproxy.registryAuthKey" . }}
        path: {{ include "rtproxy.registryAuthKey" . }}
{{- end }}
{{- if include "rtproxy.registryCA" . }}
- name: rtproxy-registry-ca
  secret:
    secretName: {{ .Values.schemaRegistry.caSecretName }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}

{{/*
Public templates for application charts (mode: sidecar). Call them with the
application chart's root context; they find this chart's values under
.Values.rtproxy. If the dependency is aliased, pass
(dict "Values" .Values.<alias> "Release" .Release) instead.

  spec:
    template:
      metadata:
        annotations:
          {{- include "rtproxy.sidecar.annotations" . | nindent 8 }}
      spec:
        containers:
          - name: app
            ...
          {{- include "rtproxy.sidecar.container" . | nindent 10 }}
        volumes:
          {{- include "rtproxy.sidecar.volumes" . | nindent 10 }}
*/}}
{{- define "rtproxy.sidecar.container" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "rtproxy" }}{{ $v = .Values.rtproxy }}{{ end -}}
{{- include "rtproxy.container" (dict "Values" $v "Release" .Release) -}}
{{- end -}}

{{- define "rtproxy.sidecar.volumes" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "rtproxy" }}{{ $v = .Values.rtproxy }}{{ end -}}
{{- include "rtproxy.volumes" (dict "Values" $v "Release" .Release) -}}
{{- end -}}

{{- define "rtproxy.sidecar.annotations" -}}
{{- $v := .Values -}}
{{- if hasKey .Values "rtproxy" }}{{ $v = .Values.rtproxy }}{{ end -}}
checksum/rtproxy-config: {{ include "rtproxy.configChecksum" (dict "Values" $v "Release" .Release) }}
{{- end -}}

{{/* rtproxy.graceSeconds is proxy.shutdownGrace in whole seconds (the schema
allows only "<n>s" and "<n>m"). */}}
{{- define "rtproxy.graceSeconds" -}}
{{- $g := .Values.proxy.shutdownGrace -}}
{{- if hasSuffix "m" $g -}}
{{- mul (trimSuffix "m" $g | int) 60 -}}
{{- else -}}
{{- trimSuffix "s" $g | int -}}
{{- end -}}
{{- end -}}
