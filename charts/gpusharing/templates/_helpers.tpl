{{/* name prefixes an object's name as config/default's namePrefix does. */}}
{{- define "gpusharing.name" -}}
{{ .root.Values.namePrefix }}{{ .name }}
{{- end }}

{{/* labels are the labels config/default puts on every object. */}}
{{- define "gpusharing.labels" -}}
app.kubernetes.io/part-of: gpusharing
{{- end }}

{{/* image renders repository:tag. */}}
{{- define "gpusharing.image" -}}
{{ .repository }}:{{ .tag }}
{{- end }}

{{/* managerNamespace is where the manager runs: manager.namespace, or the release's namespace. */}}
{{- define "gpusharing.managerNamespace" -}}
{{ default .Release.Namespace .Values.manager.namespace }}
{{- end }}

{{/* serviceAccount is the full username of a component's service account, as admission sees it. */}}
{{- define "gpusharing.serviceAccountUser" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ include "gpusharing.name" . }}
{{- end }}

{{/* deviceInterface resolves agent.deviceInterface: Auto is DRA on Kubernetes 1.36 or later (DRA serves
extended resources there, KEP-5004 beta) and Both before (the device plugin serves them). */}}
{{- define "gpusharing.deviceInterface" -}}
{{- $i := .Values.agent.deviceInterface -}}
{{- if not (has $i (list "Auto" "DevicePlugin" "DRA" "Both")) -}}
{{- fail (printf "agent.deviceInterface is %q: want Auto, DevicePlugin, DRA or Both" $i) -}}
{{- end -}}
{{- if eq $i "Auto" -}}
{{- if semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version }}DRA{{ else }}Both{{ end -}}
{{- else -}}
{{ $i }}
{{- end -}}
{{- end }}
