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

{{/* serviceAccount is the full username of a component's service account, as admission sees it. */}}
{{- define "gpusharing.serviceAccountUser" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ include "gpusharing.name" . }}
{{- end }}
