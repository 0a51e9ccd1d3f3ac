{{/* The APIService of sandbox.skiff.dev/v1beta1 (apiserver/deploy.APIService). */}}
{{- define "skiff.apiservice" -}}
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata:
  name: v1beta1.sandbox.skiff.dev
  labels:
    {{- include "skiff.labels" (dict "root" .root "name" "sandbox-apiserver") | nindent 4 }}
  {{- with .inject }}
  annotations:
    cert-manager.io/inject-ca-from: {{ . }}
  {{- end }}
spec:
  group: sandbox.skiff.dev
  version: v1beta1
  groupPriorityMinimum: 1000
  versionPriority: 15
  service:
    namespace: {{ .root.Release.Namespace }}
    name: sandbox-apiserver
    port: 443
  {{- with .caBundle }}
  caBundle: {{ . }}
  {{- end }}
{{- end }}
