{{/*
Names and labels. app.kubernetes.io/name is fixed: both monitors copy it into the `job` label
(jobLabel), and the static alert rules match job="sglang-oom-exporter".
*/}}
{{- define "sglang-oom-exporter.name" -}}
sglang-oom-exporter
{{- end }}

{{- define "sglang-oom-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains "sglang-oom-exporter" .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-sglang-oom-exporter" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "sglang-oom-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sglang-oom-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sglang-oom-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sglang-oom-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The pods the Service and the monitors select: ours, or the SGLang pods carrying the sidecar. */}}
{{- define "sglang-oom-exporter.targetSelector" -}}
{{- if eq .Values.mode "sidecar" }}
{{- $sel := (.Values.sidecar | default dict).podSelector | default dict }}
{{- if not $sel }}
{{- fail "mode sidecar: set sidecar.podSelector to the labels of the SGLang pods that carry the exporter container" }}
{{- end }}
{{- toYaml $sel }}
{{- else }}
{{- include "sglang-oom-exporter.selectorLabels" . }}
{{- end }}
{{- end }}

{{/* The metrics port's name on the selected pods. */}}
{{- define "sglang-oom-exporter.portName" -}}
{{- if eq .Values.mode "sidecar" }}
{{- (.Values.sidecar | default dict).portName | default "oom-metrics" }}
{{- else -}}
metrics
{{- end }}
{{- end }}

{{/* honorLabels: the value if set, else true unless in sidecar mode (see values.yaml). */}}
{{- define "sglang-oom-exporter.honorLabels" -}}
{{- $m := .monitor | default dict }}
{{- if kindIs "bool" $m.honorLabels }}
{{- $m.honorLabels }}
{{- else }}
{{- ne .root.Values.mode "sidecar" }}
{{- end }}
{{- end }}

{{/* The image the release publishes; values.yaml names it too (kept here for --reuse-values from older releases). */}}
{{- define "sglang-oom-exporter.publishedRepository" -}}
ghcr.io/sglang-oom-exporter/sglang-oom-exporter
{{- end }}

{{- define "sglang-oom-exporter.image" -}}
{{- $img := .Values.image | default dict }}
{{- printf "%s:%s" ($img.repository | default (include "sglang-oom-exporter.publishedRepository" .)) ($img.tag | default .Chart.AppVersion) }}
{{- end }}

{{- define "sglang-oom-exporter.serviceAccountName" -}}
{{- include "sglang-oom-exporter.fullname" . }}
{{- end }}

{{- define "sglang-oom-exporter.discoveryOn" -}}
{{- if and (eq .Values.mode "daemonset") ((.Values.discovery | default dict).enabled) }}true{{ end }}
{{- end }}

{{/* Cluster-scoped names carry the namespace: two releases of the same name in two namespaces must not clash. */}}
{{- define "sglang-oom-exporter.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "sglang-oom-exporter.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Both monitors on would scrape every exporter twice and double every count. */}}
{{- define "sglang-oom-exporter.checkMonitors" -}}
{{- if and ((.Values.serviceMonitor | default dict).enabled) ((.Values.podMonitor | default dict).enabled) }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: every exporter would be scraped twice and every OOM counted twice in sums. Enable one." }}
{{- end }}
{{- end }}
