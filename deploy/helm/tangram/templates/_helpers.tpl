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
{{ include "tangram.natsStreamEnv" . }}
{{- end -}}

{{- define "tangram.natsStreamEnv" -}}
- {name: TANGRAM_NATS_STREAM_REPLICAS, value: {{ .Values.nats.streamReplicas | quote }}}
{{- with .Values.nats.tls.caConfigMap }}
- {name: TANGRAM_NATS_TLS_CA, value: {{ include "tangram.natsCaFile" $ }}}
{{- end }}
{{- end -}}

{{/* The node services' NATS: the address and their projected token with the auth callout, else
the url file (with the node's user and password) that node provisioning placed on the host. */}}
{{- define "tangram.nodeNatsEnv" -}}
{{- if .Values.nats.authCallout.enabled -}}
- {name: TANGRAM_NATS_URL, value: {{ include "tangram.natsUrl" . }}}
- {name: TANGRAM_NATS_TOKEN_FILE, value: {{ include "tangram.natsTokenDir" . }}/token}
{{- else -}}
- {name: TANGRAM_NATS_URL_FILE, value: /etc/tangram/nats/url}
{{- end }}
{{ include "tangram.natsStreamEnv" . }}
{{- end -}}

{{/* The NATS address without credentials: nats.url, else the Service of the cluster deployed here. */}}
{{- define "tangram.natsUrl" -}}
{{- if .Values.nats.url -}}
{{- .Values.nats.url -}}
{{- else if .Values.nats.deploy -}}
nats://{{ include "tangram.fullname" . }}-nats.{{ include "tangram.namespace" . }}.svc:4222
{{- else -}}
{{- fail "nats.url is required with nats.deploy=false and nats.authCallout.enabled: the existing NATS address node services connect to with their token" -}}
{{- end -}}
{{- end -}}

{{- define "tangram.natsTokenDir" -}}
/var/run/secrets/tangram/nats
{{- end -}}

{{/* The node services' NATS credential mount: the projected token, or the host's url file. */}}
{{- define "tangram.nodeNatsMount" -}}
{{- if .Values.nats.authCallout.enabled -}}
- {name: nats-token, mountPath: {{ include "tangram.natsTokenDir" . }}, readOnly: true}
{{- else -}}
- {name: nats-credentials, mountPath: /etc/tangram/nats, readOnly: true}
{{- end -}}
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

{{/* Which pods the scheduling gate is for (webhook and policy alike): pods with claims, not bound
to a node (the API server refuses gates on those), not gated already. */}}
{{- define "tangram.admissionConditions" -}}
- name: has-claims
  expression: has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0
- name: not-bound
  expression: "!has(object.spec.nodeName) || object.spec.nodeName == ''"
- name: not-gated
  expression: >-
    !has(object.spec.schedulingGates) ||
    !object.spec.schedulingGates.exists(g, g.name == "gpu.tangram.dev/allocation")
{{- end -}}
