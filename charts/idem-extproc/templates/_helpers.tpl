{{/* The chart's name. */}}
{{- define "idem-extproc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: the release name when it holds the chart's name. */}}
{{- define "idem-extproc.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "idem-extproc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "idem-extproc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "idem-extproc.labels" -}}
{{ include "idem-extproc.selectorLabels" . }}
app.kubernetes.io/component: ext-proc
app.kubernetes.io/part-of: idem-extproc
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/*
The server's image. No default repository: none serves the image, and a
placeholder would only show up as ImagePullBackOff.
*/}}
{{- define "idem-extproc.image" -}}
{{- $repo := required "image.repository is required: build the image from the repository's Dockerfile, push it or load it into your cluster (docs/deployment.md, \"Setting the image\"), and set it with --set image.repository=<registry>/idem-extproc" .Values.image.repository }}
{{- $tag := .Values.image.tag | default .Chart.AppVersion }}
{{- if eq $tag "latest" }}{{ fail "image.tag: pin a version, not latest" }}{{ end }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* The Secret holding the Redis URL. */}}
{{- define "idem-extproc.redisSecret" -}}
{{- if .Values.redis.url }}{{ include "idem-extproc.fullname" . }}-redis
{{- else if .Values.redis.existingSecret }}{{ .Values.redis.existingSecret }}
{{- else }}{{ fail "redis.url or redis.existingSecret is required: without Redis the server keeps records in one pod's memory" }}
{{- end }}
{{- end }}

{{/* The Secret holding the encryption key ring. */}}
{{- define "idem-extproc.keysSecret" -}}
{{- if .Values.encryption.keys }}{{ include "idem-extproc.fullname" . }}-keys
{{- else if .Values.encryption.existingSecret }}{{ .Values.encryption.existingSecret }}
{{- else }}{{ fail "encryption.existingSecret or encryption.keys is required while encryption.enabled (the default policy has encrypt: true)" }}
{{- end }}
{{- end }}

{{/*
GOMEMLIMIT: goMemLimitPercent of resources.limits.memory, in MiB (the Go
runtime reads the MiB suffix: runtime/debug SetMemoryLimit, "GOMEMLIMIT").
*/}}
{{- define "idem-extproc.goMemLimit" -}}
{{- $m := toString .Values.resources.limits.memory }}
{{- $mib := 0 }}
{{- if hasSuffix "Gi" $m }}{{ $mib = mul (trimSuffix "Gi" $m | atoi) 1024 }}
{{- else if hasSuffix "Mi" $m }}{{ $mib = trimSuffix "Mi" $m | atoi }}
{{- else }}{{ fail (printf "resources.limits.memory %q: write it in Mi or Gi (GOMEMLIMIT is derived from it)" $m) }}
{{- end }}
{{- if le $mib 0 }}{{ fail "resources.limits.memory must be positive" }}{{ end }}
{{- printf "%dMiB" (div (mul $mib .Values.goMemLimitPercent) 100) }}
{{- end }}

{{/* The sidecar's drain under Istio: preStop + the server's drain + 5s. */}}
{{- define "idem-extproc.istioDrainSeconds" -}}
{{- add .Values.server.preStopSeconds .Values.server.drainTimeoutSeconds 5 }}
{{- end }}
