{{/*
Names and labels. app.kubernetes.io/name is fixed: both monitors copy it into the `job` label
(jobLabel), and the static alert rules match job="sglang-oom-exporter".
*/}}
{{- define "sglang-oom-exporter.name" -}}
sglang-oom-exporter
{{- end }}

{{/* Object names: fullnameOverride, else <release>-<nameOverride or sglang-oom-exporter> (the release name alone when it holds that). */}}
{{- define "sglang-oom-exporter.fullname" -}}
{{- $name := .Values.nameOverride | default "sglang-oom-exporter" }}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
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

{{/* Kubernetes Events need the pod of each log, which only the daemonset's /var/log/pods paths name. */}}
{{- define "sglang-oom-exporter.eventsOn" -}}
{{- if and (eq .Values.mode "daemonset") ((.Values.events | default dict).enabled) }}true{{ end }}
{{- end }}

{{/* Whether the exporter talks to the Kubernetes API at all: a ServiceAccount, its token and NODE_NAME. */}}
{{- define "sglang-oom-exporter.apiAccess" -}}
{{- if or (include "sglang-oom-exporter.discoveryOn" .) (include "sglang-oom-exporter.eventsOn" .) }}true{{ end }}
{{- end }}

{{/* Cluster-scoped names carry the namespace: two releases of the same name in two namespaces must not clash. */}}
{{- define "sglang-oom-exporter.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "sglang-oom-exporter.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* A spool cap below two of the largest requests would answer a full batch 503 on every retry (serve refuses it
too, but only once the pod runs). */}}
{{- define "sglang-oom-exporter.checkSpoolCaps" -}}
{{- $r := .Values.receiver | default dict }}
{{- $kib := $r.maxRequestKiB | default 8192 }}
{{- $caps := dict "spoolSourceMiB" ($r.spoolSourceMiB | default 256) "spoolTotalMiB" ($r.spoolTotalMiB | default 1536) }}
{{- range $key, $mib := $caps }}
{{- if lt (mul $mib 1024) (mul 2 $kib) }}
{{- fail (printf "receiver.%s: %v MiB cannot hold two requests of receiver.maxRequestKiB %v: a full batch would get 503 on every retry. Raise it to at least %v MiB or lower maxRequestKiB." $key $mib $kib (div (add (mul 2 $kib) 1023) 1024)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret whose `token` agents must send to the receiver: the one named, else the one the chart creates;
empty when the receiver is open (allowUnauthenticated) or the mode is not receiver. */}}
{{- define "sglang-oom-exporter.otlpTokenSecret" -}}
{{- $r := .Values.receiver | default dict }}
{{- if eq .Values.mode "receiver" }}
{{- if $r.bearerTokenSecret }}
{{- $r.bearerTokenSecret }}
{{- else if not $r.allowUnauthenticated }}
{{- printf "%s-otlp-token" (include "sglang-oom-exporter.fullname" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Both monitors on would scrape every exporter twice and double every count. */}}
{{- define "sglang-oom-exporter.checkMonitors" -}}
{{- if and ((.Values.serviceMonitor | default dict).enabled) ((.Values.podMonitor | default dict).enabled) }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: every exporter would be scraped twice and every OOM counted twice in sums. Enable one." }}
{{- end }}
{{- end }}

{{/*
The runbook base that render wrote into the copied rules and dashboards (files/render-defaults.yaml).
*/}}
{{- define "sglang-oom-exporter.renderedRunbookBase" -}}
{{- $meta := .Files.Get "files/render-defaults.yaml" | fromYaml -}}
{{- if or (hasKey $meta "Error") (not $meta.runbookBaseUrl) -}}
{{- fail "files/render-defaults.yaml is missing or broken: run `sglang-oom-exporter render`" -}}
{{- end -}}
{{- $meta.runbookBaseUrl -}}
{{- end -}}

{{/*
The runbook base the user set: runbookBaseUrl, else the key it moved from (prometheusRule.runbookBaseUrl, read
until the next minor release, with a NOTES.txt warning); "" when neither is set.
*/}}
{{- define "sglang-oom-exporter.userRunbookBase" -}}
{{- .Values.runbookBaseUrl | default ((.Values.prometheusRule | default dict).runbookBaseUrl | default "") -}}
{{- end -}}

{{/*
The runbook base every link of the rules and dashboards starts with: the user's (above), else render's.
*/}}
{{- define "sglang-oom-exporter.runbookBase" -}}
{{- include "sglang-oom-exporter.userRunbookBase" . | default (include "sglang-oom-exporter.renderedRunbookBase" .) | trimSuffix "/" -}}
{{- end -}}

{{/*
Values that moved, as a YAML list of {old, new, value}: each old key this release still reads and that is set.
NOTES.txt warns about each; the chart README's "Upgrades" lists them all.
*/}}
{{- define "sglang-oom-exporter.movedValues" -}}
{{- $moved := list }}
{{- with (.Values.prometheusRule | default dict).runbookBaseUrl }}
{{- $moved = append $moved (dict "old" "prometheusRule.runbookBaseUrl" "new" "runbookBaseUrl" "value" .) }}
{{- end }}
{{- toYaml (dict "moved" $moved) }}
{{- end -}}
{{/*
The GPU-node default placement's node selector terms (ORed: a node that matches any one of them is a GPU node),
as {"terms": [...]}: one term per gpuNodes.nodeLabels entry (label In [value]), then each named entry of
gpuNodes.nodeSelectorTerms (its matchExpressions, ANDed), each in name order; an entry set to null is dropped.
*/}}
{{- define "sglang-oom-exporter.gpuNodeTerms" -}}
{{- $gpu := .Values.gpuNodes | default dict }}
{{- $labels := $gpu.nodeLabels }}
{{- if not (kindIs "map" $labels) }}
{{- $labels = dict "nvidia.com/gpu.present" "true" "feature.node.kubernetes.io/amd-gpu" "true" }}
{{- end }}
{{- $terms := list }}
{{- range $key, $value := $labels }}
{{- if not (kindIs "invalid" $value) }}
{{- $terms = append $terms (dict "matchExpressions" (list (dict "key" $key "operator" "In" "values" (list (toString $value))))) }}
{{- end }}
{{- end }}
{{- range $name, $expressions := ($gpu.nodeSelectorTerms | default dict) }}
{{- if $expressions }}
{{- $terms = append $terms (dict "matchExpressions" $expressions) }}
{{- end }}
{{- end }}
{{- toYaml (dict "terms" $terms) }}
{{- end }}

{{/* "true" when the GPU-node default placement applies: daemonset mode, gpuNodes.enabled, no nodeAffinity of your own. */}}
{{- define "sglang-oom-exporter.gpuPlacement" -}}
{{- $gpu := .Values.gpuNodes | default dict }}
{{- $on := true }}
{{- if kindIs "bool" $gpu.enabled }}{{ $on = $gpu.enabled }}{{ end }}
{{- if and (eq .Values.mode "daemonset") $on (not (hasKey (.Values.affinity | default dict) "nodeAffinity")) }}true{{ end }}
{{- end }}

{{/*
The pod's affinity: .Values.affinity, plus in daemonset mode the GPU-node default placement (gpuNodes): a
required node affinity on any one of the gpuNodeTerms, unless gpuNodes.enabled is false or the affinity
already has a nodeAffinity of its own. SGLang runs on GPU nodes; an exporter on a CPU node has nothing to read.
*/}}
{{- define "sglang-oom-exporter.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) }}
{{- if include "sglang-oom-exporter.gpuPlacement" . }}
{{- $terms := (include "sglang-oom-exporter.gpuNodeTerms" . | fromYaml).terms | default list }}
{{- if not $terms }}
{{- fail "gpuNodes: every node label and node selector term is null, so the DaemonSet would run on no node. Set gpuNodes.enabled=false to run on every node the tolerations allow, or keep one term." }}
{{- end }}
{{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (dict "nodeSelectorTerms" $terms)) }}
{{- end }}
{{- if $affinity }}{{ toYaml $affinity }}{{ end }}
{{- end }}

{{/*
How many nodes the GPU placement (and nodeSelector) admits, by the same rules as the scheduler's node affinity
(terms ORed, expressions ANDed; In, NotIn, Exists, DoesNotExist, Gt, Lt): "<matching>/<all>", or "" when the
cluster did not answer (helm template, --dry-run=client: lookup returns nothing). Taints are not counted: the
tolerations cover the GPU taints.
*/}}
{{- define "sglang-oom-exporter.gpuNodeCount" -}}
{{- $nodes := (lookup "v1" "Node" "" "").items | default list }}
{{- if $nodes }}
{{- $terms := (include "sglang-oom-exporter.gpuNodeTerms" . | fromYaml).terms | default list }}
{{- $selector := .Values.nodeSelector | default dict }}
{{- $count := 0 }}
{{- range $node := $nodes }}
{{- $labels := $node.metadata.labels | default dict }}
{{- $selected := true }}
{{- range $k, $v := $selector }}
{{- if or (not (hasKey $labels $k)) (ne (toString (get $labels $k)) (toString $v)) }}{{ $selected = false }}{{ end }}
{{- end }}
{{- $anyTerm := false }}
{{- range $term := $terms }}
{{- $all := gt (len ($term.matchExpressions | default list)) 0 }}
{{- range $e := $term.matchExpressions | default list }}
{{- $has := hasKey $labels $e.key }}
{{- $value := toString (get $labels $e.key) }}
{{- $values := list }}
{{- range $x := $e.values | default list }}{{ $values = append $values (toString $x) }}{{ end }}
{{- $ok := false }}
{{- if eq $e.operator "In" }}{{ $ok = and $has (has $value $values) }}
{{- else if eq $e.operator "NotIn" }}{{ $ok = or (not $has) (not (has $value $values)) }}
{{- else if eq $e.operator "Exists" }}{{ $ok = $has }}
{{- else if eq $e.operator "DoesNotExist" }}{{ $ok = not $has }}
{{- else if and $has (regexMatch "^-?[0-9]+$" $value) (eq (len $values) 1) (regexMatch "^-?[0-9]+$" (first $values)) }}
{{- if eq $e.operator "Gt" }}{{ $ok = gt (atoi $value) (atoi (first $values)) }}{{ end }}
{{- if eq $e.operator "Lt" }}{{ $ok = lt (atoi $value) (atoi (first $values)) }}{{ end }}
{{- end }}
{{- if not $ok }}{{ $all = false }}{{ end }}
{{- end }}
{{- if $all }}{{ $anyTerm = true }}{{ end }}
{{- end }}
{{- if and $selected (or $anyTerm (not $terms)) }}{{ $count = add1 $count }}{{ end }}
{{- end }}
{{- printf "%d/%d" $count (len $nodes) }}
{{- end }}
{{- end }}

{{/*
The monitors' relabelings after the operator's own (promcfg.go adds the target labels namespace, pod,
container, service, endpoint, job). Our series name the SGLang pod (namespace/pod/container, or `source`) and
must never be given the exporter's own pod: the target's namespace/pod/container move to exporter_namespace/
exporter_pod/exporter_container, which the guard alerts use. In sidecar mode the target pod is the SGLang pod
itself, so namespace and pod stay (and are copied); only the container (the exporter's) moves.
*/}}
{{- define "sglang-oom-exporter.relabelings" -}}
- sourceLabels: [namespace]
  targetLabel: exporter_namespace
- sourceLabels: [pod]
  targetLabel: exporter_pod
- sourceLabels: [container]
  targetLabel: exporter_container
{{- if eq .Values.mode "sidecar" }}
- action: labeldrop
  regex: container
- targetLabel: job
  replacement: {{ include "sglang-oom-exporter.name" . }}
{{- else }}
- action: labeldrop
  regex: (namespace|pod|container)
{{- end }}
{{- end }}

{{/*
A copied rules file or dashboard moved to the chart's jobSelector and clusterLabel (empty: what render used,
files/render-defaults.yaml). The job selector is replaced as render wrote it; the cluster label moves with the
two patterns render writes there (promql.cluster_patterns): tests/test_overrides.py proves that the same
patterns give exactly a render with cluster_label set, and tests/test_helm.py that the chart applies them.
Call with (dict "text" $text "root" $).
*/}}
{{- define "sglang-oom-exporter.scoped" -}}
{{- $meta := .root.Files.Get "files/render-defaults.yaml" | fromYaml -}}
{{- $text := .text -}}
{{- $job := .root.Values.jobSelector | default "" -}}
{{- if and $job (ne $job $meta.jobSelector) -}}
{{- $text = replace $meta.jobSelector $job $text -}}
{{- end -}}
{{- $label := .root.Values.clusterLabel | default "" -}}
{{- if and $label (ne $label $meta.clusterLabel) -}}
{{- $text = regexReplaceAll $meta.clusterPatterns.word $text (printf "${1}%s${2}" $label) -}}
{{- $text = regexReplaceAll $meta.clusterPatterns.template $text (printf "$$labels.%s${1}" $label) -}}
{{- end -}}
{{- $text -}}
{{- end -}}

{{/* The web config (TLS, basic auth): {"on": bool, "tls": bool, "basicAuth": bool, "path": the file in the pod}. */}}
{{- define "sglang-oom-exporter.webConfig" -}}
{{- $w := .Values.webConfig | default dict }}
{{- $on := not (empty $w.secretName) }}
{{- toYaml (dict "on" $on "tls" (and $on (eq $w.tls true)) "basicAuth" (and $on (eq $w.basicAuth true))
  "path" (printf "%s/%s" "/etc/sglang-oom-exporter-web" ($w.key | default "web-config.yml"))) }}
{{- end }}

{{/* A monitor's endpoint options beyond the chart's own: scheme, tlsConfig, basicAuth, metricRelabelings. */}}
{{- define "sglang-oom-exporter.monitorEndpointOptions" -}}
{{- $m := .monitor }}
{{- $web := include "sglang-oom-exporter.webConfig" .root | fromYaml }}
{{- $scheme := $m.scheme | default (ternary "https" "" $web.tls) }}
{{- with $scheme }}
scheme: {{ . }}
{{- end }}
{{- with $m.tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
