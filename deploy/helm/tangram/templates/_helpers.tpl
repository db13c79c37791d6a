{{/* The prefix of every object's name: the release name when it says tangram, else <release>-tangram. */}}
{{- define "tangram.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tangram.namespace" -}}
{{- .Release.Namespace -}}
{{- end -}}

{{/* Labels of one component: {app.kubernetes.io/name: tangram, app.kubernetes.io/component: X}. */}}
{{- define "tangram.selector" -}}
{app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}, app.kubernetes.io/instance: {{ .root.Release.Name }}, app.kubernetes.io/component: {{ .component }}}
{{- end -}}

{{- define "tangram.labels" -}}
{app.kubernetes.io/name: {{ default .root.Chart.Name .root.Values.nameOverride }}, app.kubernetes.io/instance: {{ .root.Release.Name }}, app.kubernetes.io/component: {{ .component }}, app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}, app.kubernetes.io/managed-by: {{ .root.Release.Service }}, helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}}
{{- end -}}

{{- define "tangram.image" -}}
{{ .root.Values.image.registry }}/tangram-{{ .service }}:{{ default .root.Chart.AppVersion .root.Values.image.tag }}
{{- end -}}

{{- define "tangram.natsEnv" -}}
- {name: TANGRAM_NATS_URL_FILE, value: /etc/tangram/nats/url}
- {name: TANGRAM_NATS_STREAM_REPLICAS, value: {{ .Values.nats.streamReplicas | quote }}}
{{- with .Values.nats.tls.caConfigMap }}
- {name: TANGRAM_NATS_TLS_CA, value: {{ include "tangram.natsCaFile" $ }}}
{{- end }}
{{- end -}}

{{/* Where the containers see the CA of a NATS that speaks TLS (nats.tls.caConfigMap). */}}
{{- define "tangram.natsCaFile" -}}
/etc/tangram/nats-ca/{{ .Values.nats.tls.caKey }}
{{- end -}}

{{- define "tangram.natsCaMount" -}}
- {name: nats-ca, mountPath: /etc/tangram/nats-ca, readOnly: true}
{{- end -}}

{{- define "tangram.natsCaVolume" -}}
- name: nats-ca
  configMap:
    name: {{ .Values.nats.tls.caConfigMap }}
    items: [{key: {{ .Values.nats.tls.caKey }}, path: {{ .Values.nats.tls.caKey }}}]
{{- end -}}
