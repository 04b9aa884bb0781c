{{/* Labels every meterhub object carries. */}}
{{- define "meterhub.labels" -}}
app.kubernetes.io/name: meterhub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Selector labels of the billing service's pods. */}}
{{- define "meterhub.billing.selector" -}}
app.kubernetes.io/name: meterhub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: meterhub-billing
{{- end }}

{{/* The Secret and key holding the ledger's database URL. */}}
{{- define "meterhub.database.secret" -}}
{{- .Values.billing.database.existingSecret | default "meterhub-database" -}}
{{- end }}

{{/* The site config the hub and the billing service read: the user's, on the kubernetes backend. */}}
{{- define "meterhub.site" -}}
{{- $site := deepCopy .Values.site -}}
{{- $_ := set $site "backend" "kubernetes" -}}
{{- $kube := get $site "kubernetes" | default dict -}}
{{- $_ := set $kube "public_claim" .Values.public.claimName -}}
{{- $_ := set $site "kubernetes" $kube -}}
{{- toYaml $site -}}
{{- end }}
