{{/* The pod template of the DaemonSet and the Deployment. */}}
{{- define "sglang-oom-exporter.podTemplate" -}}
{{- $mode := .Values.mode }}
{{- $ds := .Values.daemonset | default dict }}
{{- $dep := .Values.deployment | default dict }}
{{- $rcv := .Values.receiver | default dict }}
{{- $api := include "sglang-oom-exporter.apiAccess" . }}
{{- $web := include "sglang-oom-exporter.webConfig" . | fromYaml }}
{{- $podSC := dict "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if eq $mode "daemonset" }}
{{- /* uid 0: kubelet's pod logs are root-owned and not world-readable; every capability is dropped below. */}}
{{- $_ := set $podSC "runAsUser" 0 }}
{{- $_ := set $podSC "runAsGroup" 0 }}
{{- $_ := set $podSC "runAsNonRoot" false }}
{{- else }}
{{- $_ := set $podSC "runAsUser" 65532 }}
{{- $_ := set $podSC "runAsGroup" 65532 }}
{{- $_ := set $podSC "fsGroup" 65532 }}
{{- $_ := set $podSC "runAsNonRoot" true }}
{{- end }}
{{- $podSC = mergeOverwrite $podSC (deepCopy (.Values.podSecurityContext | default dict)) }}
{{- $sc := dict "readOnlyRootFilesystem" true "allowPrivilegeEscalation" false "privileged" false "capabilities" (dict "drop" (list "ALL")) }}
{{- $sc = mergeOverwrite $sc (deepCopy (.Values.securityContext | default dict)) -}}
metadata:
  labels:
    {{- include "sglang-oom-exporter.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- if $api }}
  serviceAccountName: {{ include "sglang-oom-exporter.serviceAccountName" . }}
  automountServiceAccountToken: true
  {{- else }}
  automountServiceAccountToken: false
  {{- end }}
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $podSC | nindent 4 }}
  terminationGracePeriodSeconds: 30
  containers:
    - name: oom-exporter  # the exporter's default container filter skips *oom-exporter*, so it never reads its own log
      image: {{ include "sglang-oom-exporter.image" . | quote }}
      imagePullPolicy: {{ (.Values.image | default dict).pullPolicy | default "IfNotPresent" }}
      args:
        - serve
        - --config=/etc/sglang-oom-exporter/config.yaml
        {{- if $web.on }}
        - --web-config={{ $web.path }}
        {{- end }}
        {{- with .Values.extraArgs }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if or $api .Values.extraEnv }}
      env:
        {{- if $api }}
        # Node discovery lists the pods on this node only; Kubernetes Events name it as their reportingInstance.
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        {{- end }}
        {{- with .Values.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      ports:
        - name: metrics
          containerPort: {{ .Values.port | default 9877 }}
          protocol: TCP
        {{- if eq $mode "receiver" }}
        - name: otlp-http
          containerPort: {{ $rcv.port | default 4318 }}
          protocol: TCP
        {{- end }}
      {{- if $web.basicAuth }}
      # Basic auth (webConfig.basicAuth): a kubelet probe can send no credentials unless a password is written
      # into the pod spec, and a 401 fails it; the probes check that the port accepts connections instead.
      readinessProbe:
        tcpSocket:
          port: metrics
        periodSeconds: 10
        timeoutSeconds: 5
      livenessProbe:
        tcpSocket:
          port: metrics
        initialDelaySeconds: 10
        periodSeconds: 30
        timeoutSeconds: 10
        failureThreshold: 5
      {{- else }}
      {{- if eq $mode "daemonset" }}
      # /healthz answers 503 on a node without SGLang pods ("no log file matches"): as a readiness probe it would
      # stall every DaemonSet rollout there. Both probes ask /metrics, which answers while the process serves;
      # the SGLangOOMExporterNoLogs alert catches a wrong hostPath or filter.
      readinessProbe:
        httpGet:
          path: /metrics
          port: metrics
          {{- if $web.tls }}
          scheme: HTTPS
          {{- end }}
        periodSeconds: 10
        timeoutSeconds: 5
      {{- else }}
      # Ready when a log file is being read (503 with the reason otherwise).
      readinessProbe:
        httpGet:
          path: /healthz
          port: metrics
          {{- if $web.tls }}
          scheme: HTTPS
          {{- end }}
        periodSeconds: 10
        timeoutSeconds: 5
      {{- end }}
      livenessProbe:
        httpGet:
          path: /metrics
          port: metrics
          {{- if $web.tls }}
          scheme: HTTPS
          {{- end }}
        initialDelaySeconds: 10
        periodSeconds: 30
        timeoutSeconds: 10
        failureThreshold: 5
      {{- end }}
      {{- $resources := deepCopy (.Values.resources | default dict) }}
      {{- if and (eq $mode "receiver") $rcv.memoryLimit }}
      {{- /* The receiver's memory: the daemon and the requests it admits at once (docs/otlp.md, "Connections and memory"). */}}
      {{- $_ := set $resources "limits" (merge (dict "memory" $rcv.memoryLimit) (get $resources "limits" | default dict)) }}
      {{- end }}
      resources:
        {{- toYaml $resources | nindent 8 }}
      securityContext:
        {{- toYaml $sc | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: /etc/sglang-oom-exporter
          readOnly: true
        - name: state
          mountPath: /var/lib/sglang-oom-exporter
        - name: tmp
          mountPath: /tmp
        {{- if eq $mode "daemonset" }}
        - name: pod-logs
          mountPath: {{ $ds.logsHostPath | default "/var/log/pods" }}
          readOnly: true
        {{- range $i, $p := $ds.extraLogHostPaths }}
        - name: log-target-{{ $i }}
          mountPath: {{ $p }}
          readOnly: true
        {{- end }}
        {{- else if eq $mode "receiver" }}
        {{- if include "sglang-oom-exporter.otlpTokenSecret" . }}
        - name: otlp-token
          mountPath: /etc/sglang-oom-exporter-otlp
          readOnly: true
        {{- end }}
        {{- else }}
        - name: logs
          mountPath: {{ $dep.mountPath | default "/logs" }}
          readOnly: true
        {{- end }}
        {{- if $web.on }}
        - name: web-config
          mountPath: /etc/sglang-oom-exporter-web
          readOnly: true
        {{- end }}
        {{- with .Values.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ include "sglang-oom-exporter.fullname" . }}
    - name: tmp
      emptyDir:
        sizeLimit: 16Mi
    {{- if eq $mode "daemonset" }}
    # One directory per release: two releases on a node must never share (and overwrite) one state file.
    - name: state
      hostPath:
        path: {{ printf "%s/%s.%s" ($ds.stateHostPath | default "/var/lib/sglang-oom-exporter" | trimSuffix "/") .Release.Namespace .Release.Name }}
        type: DirectoryOrCreate
    - name: pod-logs
      hostPath:
        path: {{ $ds.logsHostPath | default "/var/log/pods" }}
        type: Directory
    {{- range $i, $p := $ds.extraLogHostPaths }}
    - name: log-target-{{ $i }}
      hostPath:
        path: {{ $p }}
        type: Directory
    {{- end }}
    {{- else if eq $mode "receiver" }}
    # No hostPath: the received lines are spooled here (docs/otlp.md), with the positions and counters.
    - name: state
      {{- toYaml ($rcv.stateVolume | default (dict "emptyDir" dict)) | nindent 6 }}
    {{- with include "sglang-oom-exporter.otlpTokenSecret" . }}
    - name: otlp-token
      secret:
        secretName: {{ . }}
        items:
          - key: token
            path: token
    {{- end }}
    {{- else }}
    - name: state
      {{- toYaml ($dep.stateVolume | default (dict "emptyDir" dict)) | nindent 6 }}
    - name: logs
      {{- if not $dep.volume }}
      {{- fail "mode deployment: set deployment.volume to the volume that holds the SGLang logs" }}
      {{- end }}
      {{- toYaml $dep.volume | nindent 6 }}
    {{- end }}
    {{- if $web.on }}
    # The web config (TLS, basic auth) and the files it names, from the Secret webConfig.secretName.
    - name: web-config
      secret:
        secretName: {{ .Values.webConfig.secretName }}
        defaultMode: 0440
    {{- end }}
    {{- with .Values.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with include "sglang-oom-exporter.affinity" . | fromYaml }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
