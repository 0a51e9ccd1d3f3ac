{{/* Labels every object carries; name is the component's. */}}
{{- define "skiff.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: skiff
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{/* The pods' selector: the component's name, as apiserver/deploy selects. */}}
{{- define "skiff.selector" -}}
app.kubernetes.io/name: {{ . }}
{{- end }}

{{- define "skiff.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Secret holding the node token (key "token"). */}}
{{- define "skiff.nodeTokenSecret" -}}
{{ .Values.nodeToken.existingSecret | default "skiff-node-token" }}
{{- end }}

{{/* The readers' freshness flags: the same contract as the publishers'. */}}
{{- define "skiff.freshnessArgs" -}}
- --inventory-stale-after={{ .Values.freshness.staleAfter }}
- --inventory-publish-interval={{ .Values.freshness.publishInterval }}
{{- end }}

{{- define "skiff.logArgs" -}}
- --log-format={{ .Values.logFormat }}
- --log-level={{ .Values.logLevel }}
{{- end }}

{{/* A pod's security context for the unprivileged components. */}}
{{- define "skiff.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Prefer one replica per node (anti-affinity on the host name). */}}
{{- define "skiff.spread" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "skiff.selector" . | nindent 12 }}
{{- end }}

{{/* The node token volume and its mount; for the readers with
nodeToken.fleetKeySecret, the fleet key instead. */}}
{{- define "skiff.tokenVolume" -}}
- name: node-token
  secret:
    secretName: {{ include "skiff.nodeTokenSecret" . }}
    defaultMode: 0440
{{- end }}
{{- define "skiff.readerTokenVolume" -}}
{{- if .Values.nodeToken.fleetKeySecret -}}
- name: fleet-key
  secret:
    secretName: {{ .Values.nodeToken.fleetKeySecret }}
    defaultMode: 0440
{{- else -}}
{{ include "skiff.tokenVolume" . }}
{{- end }}
{{- end }}
{{- define "skiff.readerTokenMount" -}}
{{- if .Values.nodeToken.fleetKeySecret -}}
- name: fleet-key
  mountPath: /etc/skiff/fleet-key
  readOnly: true
{{- else -}}
{{ include "skiff.tokenMount" . }}
{{- end }}
{{- end }}
{{- define "skiff.readerTokenArg" -}}
{{- if .Values.nodeToken.fleetKeySecret -}}
- --node-token-key-file=/etc/skiff/fleet-key/key
{{- else -}}
- --sandboxd-token-file=/etc/skiff/node-token/token
{{- end }}
{{- end }}
{{- define "skiff.tokenMount" -}}
- name: node-token
  mountPath: /etc/skiff/node-token
  readOnly: true
{{- end }}

{{/* A host pod's node: the real node's name, its address, and the virtual
node's name (nodeNamePrefix + the node's). */}}
{{- define "skiff.hostEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.hostIP
- name: SKIFF_NODE_NAME
  value: {{ printf "%s$(NODE_NAME)" .Values.hosts.nodeNamePrefix | quote }}
{{- end }}

{{/* A Go duration of whole units (1m30s, 90s, 2h) in seconds, for PromQL. */}}
{{- define "skiff.seconds" -}}
{{- $s := 0 }}
{{- range regexFindAll "[0-9]+[hms]" . -1 }}
{{- $n := int (trimSuffix "h" (trimSuffix "m" (trimSuffix "s" .))) }}
{{- if hasSuffix "h" . }}{{ $s = add $s (mul $n 3600) }}{{ else if hasSuffix "m" . }}{{ $s = add $s (mul $n 60) }}{{ else }}{{ $s = add $s $n }}{{ end }}
{{- end }}
{{- $s }}
{{- end }}
