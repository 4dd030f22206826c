{{/* The container image: image.tag, or the chart's appVersion. */}}
{{- define "sandboxctl.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* Labels on every object the chart makes, beside the component's own name. The
drift test (tests/manifests/test_chart.py) removes exactly these before comparing. */}}
{{- define "sandboxctl.labels" -}}
app.kubernetes.io/part-of: sandboxctl
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The pod security context every component runs with. */}}
{{- define "sandboxctl.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "sandboxctl.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{/* Keep away from the other replicas' nodes when there is a choice. */}}
{{- define "sandboxctl.spread" -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels: {app.kubernetes.io/name: {{ . }}}
{{- end }}

{{/* The E2B_DOMAIN variable, from the sandboxctl ConfigMap. */}}
{{- define "sandboxctl.e2bDomainEnv" -}}
env:
  - name: E2B_DOMAIN
    valueFrom:
      configMapKeyRef: {name: sandboxctl, key: e2b-domain}
{{- end }}
